//! IAM, read from the code: every action the template grants a function is
//! one its code path performs, so a stale grant (a `DescribeTable` kept
//! after the probe moved to `GetItem`) fails here.
//!
//! What follows reads the code as text (no Rust parser is a dependency of
//! this crate): comments and literals are blanked first, so that brackets,
//! names and calls are the code's own.

use super::*;

/// `src` with comments blanked, string and char literals emptied (their
/// quotes kept) and `#[cfg(test)]` items removed, and the modules declared
/// `#[cfg(test)] mod name;` (whose files are test code too).
fn code_of(src: &str) -> (String, Vec<String>) {
    let c: Vec<char> = src.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut code = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let next = |k: usize| c.get(i + k).copied();
        match c[i] {
            '/' if next(1) == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next(1) == Some('*') => {
                let mut depth = 0;
                loop {
                    if c[i] == '/' && c[i + 1] == '*' {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && c[i + 1] == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                code.push(' ');
            }
            // Raw strings: r"…", r#"…"#, br"…".
            'r' if matches!(next(1), Some('"' | '#'))
                && (i == 0
                    || !ident(c[i - 1])
                    || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2])))) =>
            {
                let mut j = i + 1;
                while c[j] == '#' {
                    j += 1;
                }
                let hashes = j - i - 1;
                if c[j] != '"' {
                    // A raw identifier (r#type).
                    code.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                while !(c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#'))) {
                    j += 1;
                }
                code.push_str("\"\"");
                i = j + 1 + hashes;
            }
            '"' => {
                i += 1;
                while c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                code.push_str("\"\"");
            }
            // A char literal ('x', '\n', '\''), or a lifetime ('a).
            '\'' if next(1) == Some('\\') => {
                i += 3;
                while c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                code.push_str("' '");
            }
            '\'' if next(2) == Some('\'') => {
                i += 3;
                code.push_str("' '");
            }
            ch => {
                code.push(ch);
                i += 1;
            }
        }
    }
    let mut test_mods = Vec::new();
    while let Some(at) = code.find("#[cfg(test)]") {
        let rest = at + "#[cfg(test)]".len();
        let k = rest + code[rest..].find([';', '{']).expect("an item");
        let end = if code.as_bytes()[k] == b';' {
            let item = code[rest..k].trim();
            if let Some((_, name)) = item.rsplit_once("mod ") {
                test_mods.push(name.trim().to_owned());
            }
            k + 1
        } else {
            closing(&code, k) + 1
        };
        code.replace_range(at..end, "");
    }
    (code, test_mods)
}

/// The index of the bracket that closes the one at `open`.
fn closing(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, b) in code.bytes().enumerate().skip(open) {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced brackets after {}", &code[open..]);
}

/// Where the expression at `at` ends: at its statement's `;`, or at the
/// `,` or bracket that ends the argument or block it is in.
fn expression_end(code: &str, at: usize) -> usize {
    let mut depth = 0;
    for (i, b) in code.bytes().enumerate().skip(at) {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => return i,
            b')' | b']' | b'}' => depth -= 1,
            b';' | b',' if depth == 0 => return i,
            _ => {}
        }
    }
    code.len()
}

/// Every identifier (or keyword) of `code`, with where it starts.
fn words(code: &str) -> Vec<(usize, &str)> {
    let b = code.as_bytes();
    let word = |i: usize| b[i].is_ascii_alphanumeric() || b[i] == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if word(i) && (i == 0 || !word(i - 1)) {
            let start = i;
            while i < b.len() && word(i) {
                i += 1;
            }
            if !b[start].is_ascii_digit() {
                out.push((start, &code[start..i]));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The identifier `text` ends with, and where it starts.
fn last_word(text: &str) -> Option<(usize, &str)> {
    let start = text
        .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')
        .len();
    (start < text.len() && !text.as_bytes()[start].is_ascii_digit())
        .then(|| (start, &text[start..]))
}

/// How many arguments `args` (the text between a call's parentheses)
/// holds: its commas outside brackets, closure parameters and turbofish.
fn arity(args: &str) -> usize {
    if args.trim().is_empty() {
        return 0;
    }
    let (mut depth, mut angle, mut closure, mut commas) = (0, 0, false, 0);
    let b = args.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'<' if i >= 2 && &b[i - 2..i] == b"::" => angle += 1,
            b'>' if angle > 0 => angle -= 1,
            b'|' if depth == 0 && angle == 0 => closure = !closure,
            b',' if depth == 0 && angle == 0 && !closure => commas += 1,
            _ => {}
        }
    }
    commas + usize::from(!args.trim_end().ends_with(','))
}

/// `text` without its `<…>` generics.
fn without_generics(text: &str) -> String {
    let mut depth = 0;
    text.chars()
        .filter(|&c| {
            match c {
                '<' => depth += 1,
                '>' if depth > 0 => {
                    depth -= 1;
                    return false;
                }
                _ => {}
            }
            depth == 0
        })
        .collect()
}

/// The type a type expression names: its last path segment, inside
/// `&`, `Arc<…>` and `Box<…>`.
fn type_name(ty: &str) -> String {
    let mut ty = ty.trim().trim_start_matches('&').trim();
    // `&'a T`: the lifetime is no part of the name.
    if ty.starts_with('\'') {
        ty = ty
            .split_once(char::is_whitespace)
            .map_or("", |(_, t)| t.trim());
    }
    for wrapper in ["Arc<", "Box<"] {
        if let Some(inner) = ty.strip_prefix(wrapper) {
            ty = inner.trim_end_matches('>');
        }
    }
    let ty = without_generics(ty);
    ty.trim()
        .rsplit("::")
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// One function of the code, with the type (and trait) of its `impl`.
#[derive(Debug)]
struct Fun {
    file: String,
    /// The `impl`'s type (`""` outside one).
    owner: String,
    /// The trait an `impl Trait for Type` implements.
    of_trait: Option<String>,
    name: String,
    /// Parameters, `self` not counted.
    params: usize,
    body: String,
}

/// A call in a body.
#[derive(Debug)]
struct Call {
    /// What it is called on: `name(…)` has `[]`, `a.b.name(…)` has
    /// `[".", "a", "b"]`, `x::name(…)` has `["::", "x"]`; a part that is no
    /// name (a call's result, a tuple field) is `"?"`.
    on: Vec<String>,
    name: String,
    /// `None`: named without a call (`Self::name` passed as a value).
    args: Option<String>,
}

impl Call {
    fn arity(&self) -> Option<usize> {
        self.args.as_deref().map(arity)
    }
}

const KEYWORDS: [&str; 14] = [
    "if", "while", "match", "for", "return", "fn", "in", "as", "let", "loop", "move", "async",
    "await", "impl",
];

/// The calls of `body`, and the functions it names as values (`::name`).
fn calls(body: &str) -> Vec<Call> {
    let b = body.as_bytes();
    let mut out = Vec::new();
    for (at, name) in words(body) {
        let after = at + name.len();
        let called = b.get(after) == Some(&b'(');
        let before = body[..at].trim_end();
        let by_path = before.ends_with("::");
        if KEYWORDS.contains(&name) || !(called || by_path) || before.ends_with("fn") {
            continue;
        }
        if !called && body[after..].starts_with("::") {
            continue;
        }
        let mut on = Vec::new();
        let mut rest = before;
        if let Some(r) = rest.strip_suffix("::") {
            on.push("::".to_owned());
            on.push(last_word(r).map_or("?", |(_, w)| w).to_owned());
        } else if rest.ends_with('.') && !rest.ends_with("..") {
            on.push(".".to_owned());
            while let Some(r) = rest.strip_suffix('.') {
                let r = r.trim_end();
                match last_word(r) {
                    Some((s, w)) if !r[..s].trim_end().ends_with("::") => {
                        on.insert(1, w.to_owned());
                        rest = r[..s].trim_end();
                        if rest.ends_with("..") {
                            break;
                        }
                    }
                    _ => {
                        on.insert(1, "?".to_owned());
                        break;
                    }
                }
            }
        }
        let args = called.then(|| body[after + 1..closing(body, after)].to_owned());
        out.push(Call {
            on,
            name: name.to_owned(),
            args,
        });
    }
    out
}

/// The functions (with bodies) of one file's code.
fn funs(file: &str, code: &str) -> Vec<Fun> {
    let ws = words(code);
    let mut impls = Vec::new();
    for &(at, w) in &ws {
        let prev = code[..at].trim_end().bytes().last();
        if w != "impl" || !matches!(prev, None | Some(b'}' | b';' | b']' | b'{')) {
            continue;
        }
        let open = at + code[at..].find('{').unwrap();
        let header = without_generics(&code[at + 4..open]);
        let header = header.split(" where ").next().unwrap();
        let (of_trait, owner) = match header.split_once(" for ") {
            Some((tr, ty)) => (Some(type_name(tr)), type_name(ty)),
            None => (None, type_name(header)),
        };
        impls.push((open, closing(code, open), of_trait, owner));
    }
    let mut out = Vec::new();
    for pair in ws.windows(2) {
        let [(fn_at, kw), (name_at, name)] = [pair[0], pair[1]];
        if kw != "fn" || !code[fn_at + 2..name_at].trim().is_empty() {
            continue;
        }
        let (mut depth, mut open, mut params_at) = (0, None, None);
        for (i, c) in code.bytes().enumerate().skip(name_at) {
            match c {
                b'(' if depth == 0 && params_at.is_none() => {
                    params_at = Some(i);
                    depth += 1;
                }
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    open = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let (Some(open), Some(params_at)) = (open, params_at) else {
            continue;
        };
        let params = &code[params_at + 1..closing(code, params_at)];
        let first = params.split(',').next().unwrap_or_default();
        let has_self = words(first).iter().any(|(_, w)| *w == "self");
        let (of_trait, owner) = impls
            .iter()
            .filter(|(s, e, ..)| *s < fn_at && fn_at < *e)
            .min_by_key(|(s, e, ..)| e - s)
            .map(|(_, _, t, o)| (t.clone(), o.clone()))
            .unwrap_or_default();
        out.push(Fun {
            file: file.to_owned(),
            owner,
            of_trait,
            name: name.to_owned(),
            params: arity(params) - usize::from(has_self),
            body: code[open..=closing(code, open)].to_owned(),
        });
    }
    out
}

/// The `.rs` files under `dir`, recursively, as (path from the repository
/// root, code), test code left out.
fn rust_files(dir: &str) -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = repo_root();
    let mut paths = Vec::new();
    walk(&root.join(dir), &mut paths);
    paths.sort();
    let mut files = Vec::new();
    let mut test_files = Vec::new();
    for path in paths {
        let (code, test_mods) = code_of(&std::fs::read_to_string(&path).unwrap());
        // `#[cfg(test)] mod x;` in <dir>/mod.rs is <dir>/x.rs; in <dir>/<file>.rs,
        // <dir>/<file>/x.rs.
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let dir = match stem {
            "mod" | "lib" | "main" => path.parent().unwrap().to_owned(),
            _ => path.with_extension(""),
        };
        for m in test_mods {
            test_files.push(dir.join(format!("{m}.rs")));
            test_files.push(dir.join(&m).join("mod.rs"));
        }
        files.push((path, code));
    }
    files
        .into_iter()
        .filter(|(path, _)| !test_files.contains(path))
        .map(|(path, code)| {
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            (rel, code)
        })
        .collect()
}

/// An action the code performs: the IAM action, the resource (a table's
/// logical id, or `Table/index/Name`) and the transaction it runs in
/// (`""`: none).
type Performed = (String, String, &'static str);

/// What each `impl <Trait> for DynamoStore` method performs, following the
/// store's own helpers (its methods, `self.helper(…)`, and free functions,
/// by name) transitively:
///
/// * a client call (`client.get_item()`, `.put_item()`, `.update_item()`,
///   `.delete_item()`, `.batch_get_item()`, `.query()`, `.scan()`, …) is
///   its action, outside any transaction; `.transact_get_items()` and
///   `.transact_write_items()` are no action of their own;
/// * the SDK's transaction item types say which transaction an item is in:
///   a `Get` is a `GetItem` inside `TransactGetItems`; a `Put`, `Update`,
///   `Delete` or `ConditionCheck` is a `PutItem`, `UpdateItem`,
///   `DeleteItem` or `ConditionCheckItem` inside `TransactWriteItems`;
/// * the table is the `&self.counters_table` / `&self.likes_table` its
///   `.table_name(…)` (or `.request_items(…)`) names; a variable there
///   stands for the tables its function mentions, or, for a helper that
///   takes the table as an argument, those its callers pass (the views
///   table is `&self.views_table`); a `.query()`
///   on an index (`.index_name(keys::RESIZE_INDEX)`) is on that index.
///
/// A client call this does not know fails the test: teach it the action.
fn store_methods() -> BTreeMap<String, (usize, BTreeSet<Performed>)> {
    let funs: Vec<Fun> = rust_files("shared/src/store/dynamodb")
        .iter()
        .flat_map(|(file, code)| funs(file, code))
        .collect();
    type Op = (String, &'static str, Option<String>);
    fn table_in(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (field, table) in [
            ("counters_table", "CountersTable"),
            ("likes_table", "LikesTable"),
            ("views_table", "ViewsTable"),
            // WRITERS_TABLE: the template points it at the views table.
            ("writers_table", "ViewsTable"),
            // The same table in either mode (trending sketches).
            ("sketch_table", "ViewsTable"),
        ] {
            if words(text).iter().any(|(_, w)| *w == field) {
                out.push(table.to_owned());
            }
        }
        out
    }
    fn direct(f: &Fun) -> Vec<Op> {
        let body = &f.body;
        let ws = words(body);
        let mut out = Vec::new();
        for (k, &(at, w)) in ws.iter().enumerate() {
            let after = &body[at + w.len()..];
            let (action, tx) = if w == "client" && after.trim_start().starts_with('.') {
                let (_, op) = ws[k + 1];
                match op {
                    "transact_get_items" | "transact_write_items" => continue,
                    "get_item" => ("GetItem", ""),
                    "put_item" => ("PutItem", ""),
                    "update_item" => ("UpdateItem", ""),
                    "delete_item" => ("DeleteItem", ""),
                    "batch_get_item" => ("BatchGetItem", ""),
                    "batch_write_item" => ("BatchWriteItem", ""),
                    "query" => ("Query", ""),
                    "scan" => ("Scan", ""),
                    "describe_table" => ("DescribeTable", ""),
                    other => panic!(
                        "{} {}: client.{other}(): which IAM action is that? Teach template.rs",
                        f.file, f.name
                    ),
                }
            } else if after.starts_with("::builder(") {
                match w {
                    "Get" => ("GetItem", "TransactGetItems"),
                    "Put" => ("PutItem", "TransactWriteItems"),
                    "Update" => ("UpdateItem", "TransactWriteItems"),
                    "Delete" => ("DeleteItem", "TransactWriteItems"),
                    "ConditionCheck" => ("ConditionCheckItem", "TransactWriteItems"),
                    _ => continue,
                }
            } else {
                continue;
            };
            let expr = &body[at..expression_end(body, at)];
            let arg = |method: &str| {
                expr.find(method).map(|i| {
                    let open = i + method.len() - 1;
                    let args = &expr[open + 1..closing(expr, open)];
                    args.split(',').next().unwrap().trim().to_owned()
                })
            };
            let named = arg(".table_name(").or_else(|| arg(".request_items("));
            let mut tables = named.as_deref().map(table_in).unwrap_or_default();
            if tables.is_empty() {
                tables = table_in(body);
            }
            if let Some(index) = arg(".index_name(") {
                assert_eq!(
                    index, "keys::RESIZE_INDEX",
                    "{} {}: an index this test does not know",
                    f.file, f.name
                );
                for t in &mut tables {
                    *t = format!("{t}/index/{}", likes::keys::RESIZE_INDEX);
                }
            }
            if tables.is_empty() {
                out.push((action.to_owned(), tx, None));
            }
            for t in tables {
                out.push((action.to_owned(), tx, Some(t)));
            }
        }
        out
    }
    fn closure(funs: &[Fun], name: &str, path: &mut Vec<String>) -> BTreeSet<Op> {
        path.push(name.to_owned());
        let mut out = BTreeSet::new();
        for f in funs.iter().filter(|f| f.name == name) {
            out.extend(direct(f));
            for call in calls(&f.body) {
                if path.contains(&call.name) || !funs.iter().any(|g| g.name == call.name) {
                    continue;
                }
                let passed = table_in(call.args.as_deref().unwrap_or_default());
                for (action, tx, table) in closure(funs, &call.name, path) {
                    match table {
                        Some(t) => out.insert((action, tx, Some(t))),
                        None if passed.is_empty() => out.insert((action, tx, None)),
                        None => {
                            for t in &passed {
                                out.insert((action.clone(), tx, Some(t.clone())));
                            }
                            true
                        }
                    };
                }
            }
        }
        path.pop();
        out
    }
    let mut out = BTreeMap::new();
    for f in funs.iter().filter(|f| is_store(&f.owner)) {
        let Some(tr) = &f.of_trait else { continue };
        if !tr.ends_with("Store") {
            continue;
        }
        let performed = closure(&funs, &f.name, &mut Vec::new())
            .into_iter()
            .map(|(action, tx, table)| {
                let table = table.unwrap_or_else(|| {
                    panic!(
                        "{tr}::{}: cannot tell which table its {action} is on",
                        f.name
                    )
                });
                (format!("dynamodb:{action}"), table, tx)
            })
            .collect();
        out.insert(f.name.clone(), (f.params, performed));
    }
    out
}

/// The code the functions run besides the store: `shared/src` outside
/// `store/dynamodb/`, its functions and the field types of its structs.
struct Domain {
    funs: Vec<Fun>,
    /// (struct, field) → the field's type name.
    fields: BTreeMap<(String, String), String>,
}

fn domain() -> Domain {
    let mut defs = Vec::new();
    let mut fields = BTreeMap::new();
    for (file, code) in rust_files("shared/src") {
        if file.starts_with("shared/src/store/dynamodb/") {
            continue;
        }
        let ws = words(&code);
        for pair in ws.windows(2) {
            let [(_, kw), (name_at, name)] = [pair[0], pair[1]];
            if kw != "struct" {
                continue;
            }
            let open = name_at + code[name_at..].find(['{', '(', ';']).unwrap();
            if code.as_bytes()[open] != b'{' {
                continue;
            }
            for field in code[open + 1..closing(&code, open)].split(',') {
                // `pub(super) name: Type<A, B>` splits at the generics'
                // commas too; the part with the field's name has its type.
                let Some((head, ty)) = field.split_once(": ") else {
                    continue;
                };
                if let Some((_, f)) = words(head).last() {
                    fields.insert((name.to_owned(), (*f).to_owned()), type_name(ty));
                }
            }
        }
        defs.extend(funs(&file, &code));
    }
    Domain { funs: defs, fields }
}

/// The HTTP handler, whose `execute` runs a parsed `Command`.
const HANDLERS: &str = "shared/src/http/handlers.rs";

/// A generic store parameter (`S`) or a store itself (the counters' and
/// likes' `DynamoStore`, the views table's `DynamoViews`).
fn is_store(ty: &str) -> bool {
    ty == "DynamoStore"
        || ty == "DynamoViews"
        || (ty.len() == 1 && ty.chars().all(|c| c.is_ascii_uppercase()))
}

impl Domain {
    /// What `call`, in a function of `owner`, may run: domain functions,
    /// and the store method of that name. Calls on `self`, `Self::`, a
    /// type, `self.field` and `app.field` (the [`likes::App`] every entry
    /// point takes) go to that type's methods; a bare or module path call
    /// to free functions; a call on anything else (a local, a call's
    /// result) to every method of that name taking as many arguments, and
    /// to the store method of that name.
    fn resolve<'a>(
        &'a self,
        owner: &str,
        call: &Call,
        store: &BTreeMap<String, (usize, BTreeSet<Performed>)>,
    ) -> (Vec<&'a Fun>, Option<String>) {
        let named = |f: &&Fun| f.name == call.name;
        let fits = |params: usize| call.arity().is_none_or(|n| n == params);
        let on: Vec<&str> = call.on.iter().map(String::as_str).collect();
        let ty: Option<String> = match on.as_slice() {
            [] => {
                let free = self
                    .funs
                    .iter()
                    .filter(named)
                    .filter(|f| f.owner.is_empty());
                return (free.collect(), None);
            }
            ["::", q] => {
                let q = if *q == "Self" { owner } else { q };
                if !q.starts_with(|c: char| c.is_ascii_uppercase()) {
                    let free = self
                        .funs
                        .iter()
                        .filter(named)
                        .filter(|f| f.owner.is_empty());
                    return (free.collect(), None);
                }
                Some(q.to_owned())
            }
            [".", first, path @ ..] => {
                let mut ty = match *first {
                    "self" => Some(owner.to_owned()),
                    "app" => Some("App".to_owned()),
                    _ => None,
                };
                for field in path {
                    ty = ty.and_then(|t| self.fields.get(&(t, (*field).to_owned())).cloned());
                }
                ty
            }
            other => panic!("{other:?}"),
        };
        match ty {
            Some(t) if is_store(&t) => (
                Vec::new(),
                store.contains_key(&call.name).then(|| call.name.clone()),
            ),
            Some(t) => (
                self.funs
                    .iter()
                    .filter(named)
                    .filter(|f| f.owner == t)
                    .collect(),
                None,
            ),
            None => (
                self.funs
                    .iter()
                    .filter(named)
                    .filter(|f| !f.owner.is_empty() && fits(f.params))
                    .collect(),
                store
                    .get(&call.name)
                    .filter(|(params, _)| fits(*params))
                    .map(|_| call.name.clone()),
            ),
        }
    }

    /// The arms of `execute` in [`HANDLERS`] (what the handler does with
    /// each parsed `Command`), by variant.
    fn command_arms(&self) -> BTreeMap<String, String> {
        let execute = self
            .funs
            .iter()
            .find(|f| f.name == "execute" && f.file == HANDLERS)
            .expect("execute in handlers.rs");
        let body = &execute.body;
        let starts: Vec<(usize, &str)> = words(body)
            .windows(2)
            .filter(|w| w[0].1 == "Command" && body[w[0].0..].starts_with("Command::"))
            .map(|w| w[1])
            .collect();
        let mut arms = BTreeMap::new();
        for (k, &(at, variant)) in starts.iter().enumerate() {
            let end = starts.get(k + 1).map_or(body.len(), |(next, _)| *next);
            arms.insert(variant.to_owned(), body[at..end].to_owned());
        }
        arms
    }
}

/// The `Command`s `likes::http::parse` makes of requests to `function`'s
/// routes in the template (every method, a valid reel, an identity, dev
/// auth: what the function can be asked to do), by variant name.
fn commands_served(function: &str, http: likes::http::Function) -> BTreeSet<String> {
    use lambda_http::RequestExt;
    use lambda_http::aws_lambda_events::query_map::QueryMap;
    let mut out = BTreeSet::new();
    let t = template();
    for r in t
        .routes
        .iter()
        .filter(|r| r.function == function && r.path != "$default")
    {
        let path = r.path.replace("{reel_id}", "r1");
        for method in ["GET", "PUT", "DELETE", "POST"] {
            let body = match method {
                "POST" if r.path == "/views" => {
                    lambda_http::Body::from(r#"{"views": [{"reel_id": "r1", "count": 1}]}"#)
                }
                "POST" => lambda_http::Body::from(r#"{"shards": 2}"#),
                _ => lambda_http::Body::Empty,
            };
            let req = lambda_http::http::Request::builder()
                .method(method)
                .uri(&path)
                .header("x-user-id", "u1")
                .body(body)
                .unwrap()
                .with_query_string_parameters("reel_ids=r1".parse::<QueryMap>().unwrap());
            if let Ok(command) = likes::http::parse(&req, likes::AuthMode::Dev, http) {
                let debug = format!("{command:?}");
                let variant = debug.split(|c: char| !c.is_alphanumeric()).next().unwrap();
                out.insert(variant.to_owned());
            }
        }
    }
    out
}

/// The store methods `function`'s code path may call: from what its
/// binary's `main` (functions/<name>/src/main.rs) calls of the `likes`
/// crate, the domain functions those call, transitively (see
/// [`Domain::resolve`]). `execute`, the HTTP handler's one match on the
/// parsed command, contributes only the arms of the commands this
/// function's routes parse to. Also: the HTTP commands it serves.
fn store_calls_of(
    function: &str,
    code_uri: &str,
    d: &Domain,
    store: &BTreeMap<String, (usize, BTreeSet<Performed>)>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let main_rs = format!("{code_uri}/src/main.rs");
    let (code, _) = code_of(&std::fs::read_to_string(repo_root().join(&main_rs)).unwrap());
    let main = funs(&main_rs, &code)
        .into_iter()
        .find(|f| f.name == "main")
        .unwrap_or_else(|| panic!("{main_rs}: no main"));
    // The names it imports from the crate.
    let mut imported = BTreeSet::new();
    for (at, _) in words(&code).iter().filter(|(_, w)| *w == "likes") {
        if code[..*at].trim_end().ends_with("use") {
            let end = at + code[*at..].find(';').unwrap();
            imported.extend(words(&code[*at..end]).iter().map(|(_, w)| (*w).to_owned()));
        }
    }
    let roots: Vec<Call> = calls(&main.body)
        .into_iter()
        .filter(|c| {
            imported.contains(&c.name)
                || matches!(c.on.as_slice(), [sep, q] if sep == "::" && imported.contains(q))
        })
        .collect();
    assert!(
        !roots.is_empty(),
        "{main_rs}: calls nothing of the likes crate"
    );
    // The HTTP handler's `Function`, named in main or in the entry point it
    // calls.
    let mut texts = vec![main.body.clone()];
    for call in &roots {
        texts.extend(d.resolve("", call, store).0.iter().map(|f| f.body.clone()));
    }
    let mut commands = BTreeSet::new();
    for text in &texts {
        for (at, w) in words(text) {
            if text[..at].ends_with("Function::") {
                let http = match w {
                    "Like" => likes::http::Function::Like,
                    "Read" => likes::http::Function::Read,
                    "Reshard" => likes::http::Function::Reshard,
                    "View" => likes::http::Function::View,
                    other => panic!("{main_rs}: Function::{other}?"),
                };
                commands.extend(commands_served(function, http));
            }
        }
    }
    let arms = d.command_arms();
    let mut todo: Vec<(String, Call)> = roots.into_iter().map(|c| (String::new(), c)).collect();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut reached = BTreeSet::new();
    while let Some((owner, call)) = todo.pop() {
        let (funs_, method) = d.resolve(&owner, &call, store);
        reached.extend(method);
        for f in funs_ {
            if !seen.insert((f.file.clone(), f.owner.clone(), f.name.clone())) {
                continue;
            }
            let bodies: Vec<&str> = if f.name == "execute" && f.file == HANDLERS {
                commands.iter().map(|c| arms[c].as_str()).collect()
            } else {
                vec![f.body.as_str()]
            };
            for body in bodies {
                todo.extend(calls(body).into_iter().map(|c| (f.owner.clone(), c)));
            }
        }
    }
    (reached, commands)
}

/// Every action a function's policy grants is one its code performs: a
/// stale grant (say, `DescribeTable` after the readiness probe became a
/// `GetItem`) fails here. Per function, per statement, per action and
/// resource: some store method that function's code path calls performs
/// that action on that table or index, inside `TransactWriteItems` if the
/// statement allows it only there (`dynamodb:EnclosingOperation`), and
/// outside it if the statement has no such condition (an unconditioned
/// grant of what runs only in transactions is wider than needed).
///
/// It reads the code, not a list: what each `impl <Trait> for
/// DynamoStore` method performs comes from its SDK calls in
/// shared/src/store/dynamodb/ ([`store_methods`]); which of those methods a
/// function calls, from its binary's `main` (functions/*/src/main.rs)
/// through shared/src/ (`http/`, `triggers.rs`, `service/`, `reshard/`,
/// `reconcile/`, `aggregate/`), the like and read functions told apart by
/// the commands their routes parse to ([`store_calls_of`]). Calls are
/// resolved by name, by the receiver's type where it is `self`, a type or
/// a field of `self` or of the `App`, and by name and arity otherwise, so a
/// path may be found that does not run (an over-approximation): a grant
/// this passes could still be unused, but one it fails is used by no
/// path. Which key formats a statement allows is
/// `each_function_may_touch_exactly_the_counters_keys_listed`'s.
fn functions_with_grants(statements: &[Statement], function: &str) -> bool {
    statements.iter().any(|s| s.function == function)
}

#[test]
fn every_action_granted_is_one_its_function_performs() {
    let store = store_methods();
    for (method, (_, performed)) in &store {
        assert!(!performed.is_empty(), "{method}: performs nothing?");
    }
    let d = domain();
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&std::fs::read_to_string(repo_root().join("template.yaml")).unwrap())
            .unwrap();
    let statements = dynamodb_statements();
    let functions: BTreeSet<&str> = statements.iter().map(|s| s.function.as_str()).collect();
    // Like, Read, Reshard, Reconcile, Aggregate, ViewAggregate and Warm
    // (the view function touches no table: it puts onto ViewsStream).
    assert_eq!(functions.len(), 7, "{functions:?}");
    let mut all_commands = BTreeSet::new();
    let mut wrong = Vec::new();
    for function in functions {
        let code_uri = doc["Resources"][function]["Properties"]["CodeUri"]
            .as_str()
            .unwrap_or_else(|| panic!("{function}: CodeUri"));
        let (methods, commands) = store_calls_of(function, code_uri, &d, &store);
        all_commands.extend(commands);
        let performed: BTreeSet<&Performed> = methods.iter().flat_map(|m| &store[m].1).collect();
        let mut unused = Vec::new();
        for st in statements.iter().filter(|s| s.function == function) {
            // The stream reads are the event source mapping's, not the code's.
            if st
                .resources
                .iter()
                .all(|r| r.contains("StreamArn") || r.contains("/stream/"))
            {
                continue;
            }
            let only_in_tx = st
                .enclosing
                .as_ref()
                .is_some_and(|ops| ops.iter().any(|o| o == "TransactWriteItems"));
            for action in &st.actions {
                for resource in &st.resources {
                    let resource = resource.replace("${", "").replace(".Arn}", "");
                    let txs: Vec<&str> = performed
                        .iter()
                        .filter(|(a, r, _)| a == action && *r == resource)
                        .map(|(_, _, tx)| *tx)
                        .collect();
                    let in_tx = txs.contains(&"TransactWriteItems");
                    let outside = txs.iter().any(|tx| *tx != "TransactWriteItems");
                    let why = match (only_in_tx, in_tx, outside) {
                        (true, true, _) | (false, _, true) => continue,
                        (true, false, _) => "allowed inside TransactWriteItems, performed in none",
                        (false, true, false) => {
                            "allowed outside transactions, performed only inside \
                             TransactWriteItems (condition it on dynamodb:EnclosingOperation)"
                        }
                        (false, false, false) => "performed by none of its code paths",
                    };
                    unused.push(format!(
                        "{function} {}: {action} on {resource}: {why}",
                        st.sid
                    ));
                }
            }
        }
        if !unused.is_empty() {
            wrong.push(format!(
                "{}\n  ({function} calls {methods:?}, which perform {performed:?})",
                unused.join("\n")
            ));
        }
    }
    assert!(wrong.is_empty(), "stale grants:\n{}", wrong.join("\n"));
    // A function granted no table (the view function) calls no store
    // method that would need one; its commands count below.
    for (name, res) in doc["Resources"].as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        let code_uri = res["Properties"]["CodeUri"].as_str();
        if res["Type"] != "AWS::Serverless::Function" || functions_with_grants(&statements, name) {
            continue;
        }
        let (methods, commands) = store_calls_of(name, code_uri.unwrap(), &d, &store);
        assert!(
            methods.is_empty(),
            "{name} has no table, yet calls {methods:?}"
        );
        all_commands.extend(commands);
    }
    // Every command the handler executes is some function's.
    let arms: BTreeSet<String> = d.command_arms().into_keys().collect();
    assert_eq!(all_commands, arms, "commands served vs the arms of execute");
}

/// The counters-table key kinds ([`super::key_kinds`]) each store method
/// reads or writes outside `TransactWriteItems`, by action. Kept by hand:
/// the code names its keys through `keys.rs` helpers and parameters, which
/// reading it as text cannot follow. A method that touches the counters
/// table outside a transaction and is not listed fails the test below.
const KEYS_OUTSIDE_TX: &[(&str, &str, &[&str])] = &[
    ("add_caller_reads", "UpdateItem", &["caller"]),
    ("add_run_count", "UpdateItem", &["count"]),
    ("checkpoint", "GetItem", &["checkpoint"]),
    ("claim_rowless", "GetItem", &["count"]),
    ("claim_rowless", "PutItem", &["count"]),
    ("count_items", "BatchGetItem", &["base", "shard"]),
    // A shrink's fold reads the shard whose value and window buckets it
    // moves.
    ("fold", "GetItem", &["shard"]),
    ("get_chunk", "GetItem", &["chunk"]),
    ("key_record", "GetItem", &["idem"]),
    ("load_run", "GetItem", &["run"]),
    ("ping", "GetItem", &["settings"]),
    ("put_chunk", "PutItem", &["chunk"]),
    ("put_list", "PutItem", &["list"]),
    ("put_settings", "PutItem", &["settings"]),
    ("put_warm", "PutItem", &["warm"]),
    ("put_warm_set", "PutItem", &["warmset"]),
    ("record_unchanged", "GetItem", &["idem"]),
    (
        "reel_view",
        "BatchGetItem",
        &["base", "ledger", "settings", "shard", "shard0"],
    ),
    (
        "reel_view",
        "GetItem",
        &["base", "ledger", "settings", "shard", "shard0"],
    ),
    ("reopen", "BatchGetItem", &["shard"]),
    ("run_counts", "BatchGetItem", &["count"]),
    ("save_run", "PutItem", &["run"]),
    // A scan names no key: the grant is the table's.
    ("scan_page", "Scan", &[]),
    ("scan_known", "Scan", &[]),
    ("settings", "BatchGetItem", &["settings"]),
    ("shard", "GetItem", &["base", "shard", "shard0"]),
    ("sum_shards", "BatchGetItem", &["base", "shard", "shard0"]),
    ("sum_shards", "GetItem", &["base", "shard", "shard0"]),
    ("trending_list", "GetItem", &["list"]),
    ("warm_figures", "BatchGetItem", &["warm"]),
    ("warm_set", "GetItem", &["warmset"]),
];

/// The other direction of [`every_action_granted_is_one_its_function_performs`]:
/// every call a function's code path makes on the counters table outside
/// `TransactWriteItems` is granted to it, on every key kind the store
/// method touches ([`KEYS_OUTSIDE_TX`]). IAM refuses what is not granted,
/// and a refused call on a best-effort path (an automatic grow, dropping
/// stale buckets) is only a warning in the logs: no local test meets IAM.
/// (`TransactGetItems` needs `GetItem` on its items, as a plain read does.)
/// On the views table, whose key kinds are not modelled here, at least the
/// action must be granted on the table (a missing one let the aggregator's
/// read of its writer items' tails through, 24d22c1).
/// The views aggregator is left out: its store methods share names with
/// the likes store's, so resolving its calls by name reaches both, and it
/// is granted no counters-table action at all (checked in template.rs).
#[test]
fn every_counters_call_a_function_makes_outside_transactions_is_granted() {
    let store = store_methods();
    let d = domain();
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&std::fs::read_to_string(repo_root().join("template.yaml")).unwrap())
            .unwrap();
    let statements = dynamodb_statements();
    let kinds = super::key_kinds();
    let functions: BTreeSet<&str> = statements.iter().map(|s| s.function.as_str()).collect();
    // Whether `function` is granted `action` on `table` outside a
    // transaction, on any key.
    let on_table = |function: &str, action: &str, table: &str| {
        statements.iter().any(|st| {
            st.function == function
                && st
                    .actions
                    .iter()
                    .any(|a| *a == format!("dynamodb:{action}"))
                && st.resources.iter().any(|r| r == table)
                && st.enclosing.is_none()
        })
    };
    let mut missing = Vec::new();
    for function in functions
        .into_iter()
        .filter(|f| *f != "ViewAggregateFunction")
    {
        let code_uri = doc["Resources"][function]["Properties"]["CodeUri"]
            .as_str()
            .unwrap_or_else(|| panic!("{function}: CodeUri"));
        let (methods, _) = store_calls_of(function, code_uri, &d, &store);
        for method in &methods {
            for (action, table, tx) in &store[method].1 {
                if table == "ViewsTable" && *tx != "TransactWriteItems" {
                    // The views table's key kinds are not modelled here:
                    // at least the action must be granted on the table.
                    let action = action.trim_start_matches("dynamodb:");
                    if !on_table(function, action, "ViewsTable") {
                        missing.push(format!(
                            "{function} calls {method}: {action} on ViewsTable not granted"
                        ));
                    }
                    continue;
                }
                if table != "CountersTable" || *tx == "TransactWriteItems" {
                    continue;
                }
                let action = action.trim_start_matches("dynamodb:");
                let Some((.., want)) = KEYS_OUTSIDE_TX
                    .iter()
                    .find(|(m, a, _)| m == method && *a == action)
                else {
                    missing.push(format!(
                        "{method} {action}: which key kinds? Add it to KEYS_OUTSIDE_TX"
                    ));
                    continue;
                };
                if want.is_empty() {
                    if !on_table(function, action, "CountersTable") {
                        missing.push(format!("{function} calls {method}: {action} not granted"));
                    }
                    continue;
                }
                let granted = super::granted_kinds(
                    &kinds,
                    &statements,
                    function,
                    &format!("dynamodb:{action}"),
                    false,
                );
                for kind in want.iter().filter(|k| !granted.contains(k)) {
                    missing.push(format!(
                        "{function} calls {method}, which may {action} {kind} items outside a \
                         transaction: not granted (granted: {granted:?})"
                    ));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "\n{}", missing.join("\n"));
}
