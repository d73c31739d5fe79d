//! The rooms of every crate stay small and acyclic. For each crate of the
//! workspace with a `src/` folder (`shared`, `local`, `faultproxy`, the
//! functions, `tests`):
//!
//! * no two sibling modules depend on each other through any chain, at
//!   every folder level: the top-level modules of the crate, and as much
//!   the files of one folder (`local/src/bench/` holds `load`, `store`,
//!   `variant`, `views`, ... side by side inside `bench`). An import circle
//!   means a concern sits in the wrong room;
//! * every source file under `src/` belongs to the module tree of the
//!   crate's root, so that none escapes the check;
//! * no source file grows past [`MAX_LINES`] lines.
//!
//! Plain text processing of the sources, no compiler: comments, strings
//! and character literals are skipped, and every path that starts with
//! `crate`, `self`, `super` or a name the module imports (or takes from
//! its parent with `use super::*`) is followed through the module tree and
//! through `use` declarations (so `super::Variant`, re-exported by the
//! parent from `variant`, counts as a dependency on `variant`), `use`
//! groups (`use super::{a, b}`) included. A reference from inside a
//! module to something outside it counts for the pair of siblings that
//! hold the two: a file of `bench/views/` naming `bench::load` makes
//! `views` depend on `load`. Code in a file's inline modules (its tests)
//! counts as the file's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file past this many lines holds more than one concern.
const MAX_LINES: usize = 600;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The workspace's members that have a `src/` folder, as paths relative to
/// the root (`shared`, `functions/like`, ...), from the root manifest.
fn crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("the root manifest");
    let at = manifest.find("members").expect("a members list");
    let list = &manifest[at..];
    let list = &list[list.find('[').expect("[")..=list.find(']').expect("]")];
    let members: Vec<String> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    members
        .into_iter()
        .filter(|m| root().join(m).join("src").is_dir())
        .collect()
}

/// One crate's sources: path relative to its `src/` → text.
type Sources = BTreeMap<PathBuf, String>;

fn read_crate(krate: &str) -> Sources {
    let src = root().join(krate).join("src");
    sources(&src)
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("readable source");
            (f.strip_prefix(&src).expect("under src").to_path_buf(), text)
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// The tokens of Rust source that matter to paths and module nesting:
/// identifiers, `::` and punctuation. Comments (nested block comments
/// included), string, byte and raw string literals, character literals,
/// lifetimes and numbers are dropped, so that a brace or a path inside
/// them counts for nothing.
fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    // Past a string opened at `i` (the quote), with `hashes` raw hashes (or
    // `None`: escapes apply).
    let end_of_string = |mut i: usize, hashes: Option<usize>| -> usize {
        i += 1;
        while i < c.len() {
            match hashes {
                None if c[i] == '\\' => i += 2,
                None if c[i] == '"' => return i + 1,
                Some(h)
                    if c[i] == '"'
                        && c[i + 1..].iter().take(h).filter(|&&x| x == '#').count() == h =>
                {
                    return i + 1 + h;
                }
                _ => i += 1,
            }
        }
        i
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = end_of_string(i, None);
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{7f}', '{'), else a
            // lifetime or label ('a, 'static), whose name is dropped.
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "b" | "c" | "r" | "br" | "cr");
            let raw = matches!(word.as_str(), "r" | "br" | "cr");
            if prefix && c.get(i) == Some(&'"') {
                i = end_of_string(i, raw.then_some(0));
            } else if raw && c.get(i) == Some(&'#') {
                let hashes = c[i..].iter().take_while(|&&x| x == '#').count();
                if c.get(i + hashes) == Some(&'"') {
                    i = end_of_string(i + hashes, Some(hashes));
                } else if word == "r" {
                    // A raw identifier, r#type.
                    i += 1;
                    let s = i;
                    while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                        i += 1;
                    }
                    out.push(Token::Ident(c[s..i].iter().collect()));
                } else {
                    out.push(Token::Ident(word));
                }
            } else if word == "b" && c.get(i) == Some(&'\'') {
                i += 1;
                if c.get(i) == Some(&'\\') {
                    i += 1;
                }
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else {
                out.push(Token::Ident(word));
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push(Token::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// A module, as the path of names from the crate root (`[]` for the root).
type Module = Vec<String>;

/// What one crate tree's sources say about modules and paths.
#[derive(Default)]
struct Tree {
    /// Every module, of a file or inline.
    modules: BTreeSet<Module>,
    /// Each file's module.
    files: BTreeMap<PathBuf, Module>,
    /// `use` bindings: (module, name) → the path it names, as written in
    /// that module.
    bindings: BTreeMap<(Module, String), Vec<String>>,
    /// `use x::*`: module → the paths it takes everything from.
    globs: BTreeMap<Module, Vec<Vec<String>>>,
    /// Every path that may name another module: the module it is written
    /// in, and the path.
    refs: Vec<(Module, Vec<String>)>,
}

impl Tree {
    /// The module tree of the crate root `root_file` (`lib.rs`, `main.rs`),
    /// following `mod name;` declarations to their files.
    fn build(src: &Sources, root_file: &Path) -> Tree {
        let mut tree = Tree::default();
        tree.modules.insert(Vec::new());
        // A file, its module, and the folder its child modules' files sit in.
        let mut todo = vec![(root_file.to_path_buf(), Module::new(), PathBuf::new())];
        while let Some((file, module, dir)) = todo.pop() {
            let Some(text) = src.get(&file) else {
                continue;
            };
            tree.files.insert(file.clone(), module.clone());
            for (child, inline) in tree.scan(&tokens(text), &module) {
                // A `mod x;` inside `mod t { .. }` has its file under `t/`.
                let mut at = dir.clone();
                for name in &inline[module.len()..] {
                    at.push(name);
                }
                let mut path = inline.clone();
                path.push(child.clone());
                tree.modules.insert(path.clone());
                let flat = at.join(format!("{child}.rs"));
                let file = if src.contains_key(&flat) {
                    flat
                } else {
                    at.join(&child).join("mod.rs")
                };
                todo.push((file, path, at.join(&child)));
            }
        }
        tree
    }

    /// Records the modules, bindings and paths of one file of `module`;
    /// returns its `mod name;` declarations, each with the (inline) module
    /// that declares it.
    fn scan(&mut self, t: &[Token], module: &Module) -> Vec<(String, Module)> {
        let ident = |i: usize| match t.get(i) {
            Some(Token::Ident(s)) => Some(s.as_str()),
            _ => None,
        };
        let mut declared = Vec::new();
        // The inline modules open here, with the brace depth inside each.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < t.len() {
            let mut here = module.clone();
            here.extend(inline.iter().map(|(n, _)| n.clone()));
            match &t[i] {
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth -= 1;
                }
                Token::Ident(w) if w == "mod" => {
                    if let Some(name) = ident(i + 1) {
                        match t.get(i + 2) {
                            Some(Token::Punct(';')) => declared.push((name.to_owned(), here)),
                            Some(Token::Punct('{')) => {
                                let mut path = here;
                                path.push(name.to_owned());
                                self.modules.insert(path);
                                inline.push((name.to_owned(), depth + 1));
                            }
                            _ => {}
                        }
                        i += 2;
                        continue;
                    }
                }
                Token::Ident(w) if w == "use" => {
                    let end = t[i..]
                        .iter()
                        .position(|x| *x == Token::Punct(';'))
                        .map_or(t.len(), |p| i + p);
                    let mut leaves = Vec::new();
                    use_tree(&t[i + 1..end], &[], &mut leaves);
                    for leaf in leaves {
                        match leaf {
                            Leaf::Name(name, path) => {
                                self.bindings.insert((here.clone(), name), path.clone());
                                self.refs.push((here.clone(), path));
                            }
                            Leaf::Glob(path) => {
                                self.globs
                                    .entry(here.clone())
                                    .or_default()
                                    .push(path.clone());
                                self.refs.push((here.clone(), path));
                            }
                        }
                    }
                    i = end;
                    continue;
                }
                Token::Ident(first) if i == 0 || t[i - 1] != Token::PathSep => {
                    let mut path = vec![first.clone()];
                    let mut j = i + 1;
                    while t.get(j) == Some(&Token::PathSep) {
                        let Some(next) = ident(j + 1) else {
                            break;
                        };
                        path.push(next.to_owned());
                        j += 2;
                    }
                    if path.len() > 1 {
                        self.refs.push((here, path));
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        declared
    }

    /// `name` as a bare first segment in `module`: a child module, a name
    /// it imports, or one it takes with a glob. `None`: another crate or an
    /// item of the module.
    fn bare(&self, module: &Module, name: &str, hops: usize) -> Option<(Module, bool)> {
        if hops > 8 {
            return None;
        }
        let mut child = module.clone();
        child.push(name.to_owned());
        if self.modules.contains(&child) {
            return Some((child, true));
        }
        if let Some(path) = self.bindings.get(&(module.clone(), name.to_owned())) {
            return self.resolve(module, path, hops + 1);
        }
        for glob in self.globs.get(module).into_iter().flatten() {
            if let Some((from, true)) = self.resolve(module, glob, hops + 1)
                && let Some(found) = self.bare(&from, name, hops + 1)
            {
                return Some(found);
            }
        }
        None
    }

    /// The module `path`, written in `module`, leads to: the module it
    /// names (`true`), or the module of the item it names (`false`).
    /// `None` for paths into other crates.
    fn resolve(&self, module: &Module, path: &[String], hops: usize) -> Option<(Module, bool)> {
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.clone(),
            "super" => module[..module.len().checked_sub(1)?].to_vec(),
            name => {
                let (m, exact) = self.bare(module, name, hops)?;
                if !exact {
                    return Some((m, false));
                }
                m
            }
        };
        for seg in rest {
            match seg.as_str() {
                "self" => {}
                "super" => {
                    at.pop()?;
                }
                name => {
                    let mut child = at.clone();
                    child.push(name.to_owned());
                    if self.modules.contains(&child) {
                        at = child;
                    } else if let Some(p) = self.bindings.get(&(at.clone(), name.to_owned()))
                        && hops < 8
                    {
                        let (m, exact) = self.resolve(&at, p, hops + 1)?;
                        if !exact {
                            return Some((m, false));
                        }
                        at = m;
                    } else {
                        return Some((at, false));
                    }
                }
            }
        }
        Some((at, true))
    }

    /// Module → the sibling modules it depends on, at every level.
    fn graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for m in &self.modules {
            deps.entry(m.join("::")).or_default();
        }
        for (from, path) in &self.refs {
            let Some((to, _)) = self.resolve(from, path, 0) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                deps.entry(from[..=common].join("::"))
                    .or_default()
                    .insert(to[..=common].join("::"));
            }
        }
        deps
    }
}

/// A leaf of a `use` tree.
enum Leaf {
    /// The name it binds (alias or last segment), and the path.
    Name(String, Vec<String>),
    /// `path::*`.
    Glob(Vec<String>),
}

/// The leaves of the `use` tree in `t` (after `use`, before `;`), under
/// `prefix`.
fn use_tree(t: &[Token], prefix: &[String], out: &mut Vec<Leaf>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    // A leading `::` names another crate.
    if t.first() == Some(&Token::PathSep) {
        return;
    }
    while i < t.len() {
        match &t[i] {
            Token::Ident(w) if w == "as" => {
                if let Some(Token::Ident(alias)) = t.get(i + 1) {
                    let name = alias.clone();
                    push_name(&path, Some(name), out);
                }
                return;
            }
            Token::Ident(w) => {
                path.push(w.clone());
                i += 1;
            }
            Token::PathSep => i += 1,
            Token::Punct('*') => {
                out.push(Leaf::Glob(path));
                return;
            }
            Token::Punct('{') => {
                // The group's items, split at its top-level commas.
                let mut depth = 0;
                let mut start = i + 1;
                for j in i..t.len() {
                    match t[j] {
                        Token::Punct('{') => depth += 1,
                        Token::Punct('}') => {
                            depth -= 1;
                            if depth == 0 {
                                use_tree(&t[start..j], &path, out);
                                return;
                            }
                        }
                        Token::Punct(',') if depth == 1 => {
                            use_tree(&t[start..j], &path, out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            _ => return,
        }
    }
    if path.len() > prefix.len() {
        push_name(&path, None, out);
    }
}

/// A named leaf: `a::b` binds `b`, `a::{self}` binds `a`.
fn push_name(path: &[String], alias: Option<String>, out: &mut Vec<Leaf>) {
    let mut path = path.to_vec();
    if path.last().is_some_and(|l| l == "self") {
        path.pop();
    }
    let Some(last) = path.last() else {
        return;
    };
    // `use Trait as _` binds no name, but still names its module.
    let name = alias.unwrap_or_else(|| last.clone());
    let name = if name == "_" { String::new() } else { name };
    out.push(Leaf::Name(name, path));
}

/// One cycle of the graph, if there is any (depth-first search).
fn find_cycle(deps: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for next in deps.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, deps, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    deps.keys()
        .find_map(|m| visit(m, deps, &mut Vec::new(), &mut done))
}

/// One cycle per group of siblings that has any, so that a report names
/// every folder with a circle, not only the first.
fn cycles_by_folder(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let parent = |m: &str| m.rsplit_once("::").map_or("", |(p, _)| p).to_owned();
    let mut groups: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (m, to) in deps {
        // Edges join siblings only, so each group is a graph of its own.
        groups
            .entry(parent(m))
            .or_default()
            .insert(m.clone(), to.clone());
    }
    groups.values().filter_map(find_cycle).collect()
}

/// The crate roots of a `src/` folder: the library, the binary, and any
/// further binaries under `bin/`.
fn roots(src: &Sources) -> Vec<PathBuf> {
    src.keys()
        .filter(|f| {
            let s = f.to_string_lossy();
            s == "lib.rs"
                || s == "main.rs"
                || (f.starts_with("bin") && (f.components().count() == 2 || f.ends_with("main.rs")))
        })
        .cloned()
        .collect()
}

/// Each crate tree of one crate's sources: its root file, and its tree.
fn trees(src: &Sources) -> Vec<(PathBuf, Tree)> {
    roots(src)
        .into_iter()
        .map(|r| {
            let tree = Tree::build(src, &r);
            (r, tree)
        })
        .collect()
}

#[test]
fn no_import_cycle_between_sibling_modules_of_any_crate() {
    let crates = crates();
    for expected in ["shared", "local", "faultproxy", "tests", "functions/like"] {
        assert!(crates.iter().any(|c| c == expected), "{crates:?}");
    }
    let mut cycles = Vec::new();
    let mut graphs = BTreeMap::new();
    for krate in &crates {
        let src = read_crate(krate);
        let trees = trees(&src);
        assert!(!trees.is_empty(), "{krate}/src has no lib.rs or main.rs");
        // Every file is some root's module, or the check would miss it.
        let reached: BTreeSet<&PathBuf> = trees.iter().flat_map(|(_, t)| t.files.keys()).collect();
        for file in src.keys() {
            assert!(
                reached.contains(file),
                "{krate}/src/{} is in no module tree",
                file.display()
            );
        }
        for (root_file, tree) in trees {
            let graph = tree.graph();
            for c in cycles_by_folder(&graph) {
                cycles.push(format!(
                    "{krate}/src ({}): {}",
                    root_file.display(),
                    c.join(" -> ")
                ));
            }
            graphs.insert(format!("{krate}/{}", root_file.display()), graph);
        }
    }
    // The scan sees the paths it must: `crate::` at the top level, and
    // `super::` between the files of one folder.
    let shared = &graphs["shared/lib.rs"];
    assert!(shared["triggers"].contains("aggregate"), "{shared:?}");
    let local = &graphs["local/lib.rs"];
    assert!(local["bench::measure"].contains("bench::load"), "{local:?}");
    assert!(
        local["bench::views"].contains("bench::variant"),
        "{local:?}"
    );
    assert!(
        cycles.is_empty(),
        "import cycles between sibling modules:\n{}",
        cycles.join("\n")
    );
}

/// A crate in memory: path under `src/` → text.
fn planted(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
        .collect()
}

#[test]
fn a_planted_cycle_is_found_at_a_nested_level() {
    // Inside `room`, x names y with `super::`, y names z (and v) with a
    // `crate::` path in a group, z takes x's item through the parent's
    // re-export; w's inline tests name x, but nothing names w.
    let src = planted(&[
        ("lib.rs", "mod room;\nmod other;\n"),
        ("other.rs", "pub fn f() {}\n"),
        (
            "room/mod.rs",
            "mod v;\nmod w;\nmod x;\nmod y;\nmod z;\npub use self::x::Thing;\n",
        ),
        ("room/x.rs", "use super::y::Y;\npub struct Thing;\n"),
        (
            "room/y.rs",
            "use crate::room::{z::{self, Z}, v};\npub struct Y;\n",
        ),
        ("room/v.rs", ""),
        ("room/z.rs", "pub struct Z(super::Thing);\n"),
        (
            "room/w.rs",
            "// super::x::Thing in a comment\n\
             const S: &str = \"super::y::Y {\";\n\
             const C: char = '{';\n\
             fn f() { crate::other::f(); }\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    fn g() { super::super::x::Thing; }\n}\n",
        ),
    ]);
    let trees = trees(&src);
    assert_eq!(trees.len(), 1);
    let graph = trees[0].1.graph();
    assert_eq!(
        find_cycle(&graph).map(|c| c.join(" -> ")).as_deref(),
        Some("room::x -> room::y -> room::z -> room::x"),
        "{graph:?}"
    );
    // A comment, a string and a brace in a character literal count for
    // nothing; the inline tests count as their file's.
    assert_eq!(
        graph["room::w"],
        ["room::x".to_owned()].into_iter().collect(),
        "{graph:?}"
    );
    assert_eq!(graph["room"], ["other".to_owned()].into_iter().collect());
    assert!(graph["room::w::tests"].is_empty(), "{graph:?}");

    // Without z's use of x, no circle.
    let mut fixed = src.clone();
    fixed.insert("room/z.rs".into(), "pub struct Z;\n".into());
    let graph = trees_graph(&fixed);
    assert_eq!(find_cycle(&graph), None, "{graph:?}");
}

fn trees_graph(src: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    trees(src).remove(0).1.graph()
}

#[test]
fn a_planted_cycle_is_found_at_the_top_level() {
    let graph = trees_graph(&planted(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub use b::B;\n"),
        ("a.rs", "use crate::B;\npub struct A;\n"),
        ("b.rs", "pub struct B(pub crate::a::A);\n"),
    ]));
    assert_eq!(
        find_cycle(&graph).map(|c| c.join(" -> ")).as_deref(),
        Some("a -> b -> a")
    );
}

#[test]
fn no_source_file_is_a_large_room() {
    let root = root();
    let mut large = Vec::new();
    for krate in crates() {
        for file in sources(&root.join(&krate).join("src")) {
            let lines = std::fs::read_to_string(&file)
                .expect("readable")
                .lines()
                .count();
            if lines > MAX_LINES {
                large.push(format!(
                    "{}: {lines} lines",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        large.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        large.join("\n")
    );
}
