//! The library's rooms stay small and acyclic: no two top-level modules of
//! `shared/src` or `local/src` depend on each other through any chain of
//! `crate::` paths (an import cycle means a concern sits in the wrong room),
//! and no source file of either crate grows past [`MAX_LINES`] lines. Plain
//! text processing of the sources: comments are skipped, every `crate::x`
//! outside them counts as a dependency on `x`.

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

/// The top-level module a file of `src` belongs to (`store/dynamodb/mod.rs`
/// → `store`); `None` for the crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

/// Top-level module → the top-level modules its code names as `crate::x`.
/// Items the crate root re-exports (`crate::App`) count as their module's.
fn graph(src: &Path, reexports: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(src) {
        let Some(module) = module_of(src, &file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("readable source");
        let set = deps.entry(module.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for part in code.split("crate::").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let name = reexports
                    .iter()
                    .find(|(item, _)| *item == name)
                    .map_or(name.clone(), |(_, m)| (*m).to_owned());
                if name != module && !name.is_empty() {
                    set.insert(name);
                }
            }
        }
    }
    let known: BTreeSet<String> = deps.keys().cloned().collect();
    for set in deps.values_mut() {
        set.retain(|m| known.contains(m));
    }
    deps
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

#[test]
fn no_import_cycle_between_top_level_modules() {
    let root = root();
    let shared = graph(
        &root.join("shared/src"),
        &[("App", "app"), ("Error", "error"), ("Config", "config")],
    );
    assert!(shared.len() > 10, "{shared:?}");
    assert!(
        shared["triggers"].contains("aggregate"),
        "the scan sees crate:: paths: {shared:?}"
    );
    if let Some(c) = find_cycle(&shared) {
        panic!("shared/src import cycle: {}", c.join(" -> "));
    }
    let local = graph(&root.join("local/src"), &[]);
    if let Some(c) = find_cycle(&local) {
        panic!("local/src import cycle: {}", c.join(" -> "));
    }
}

#[test]
fn a_planted_cycle_is_found() {
    let deps: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, d)| (m.to_owned(), d.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        find_cycle(&deps).map(|c| c.join(" -> ")).as_deref(),
        Some("a -> b -> c -> a")
    );
}

#[test]
fn no_source_file_is_a_large_room() {
    let root = root();
    let mut large = Vec::new();
    for dir in ["shared/src", "local/src"] {
        for file in sources(&root.join(dir)) {
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
