//! docs/reference.md is the one place that states every setting, limit,
//! key format and metric; this keeps it true. Plain text processing of the
//! sources, the template and the page, no parser library:
//!
//! * every environment variable the code reads (the readers of
//!   `shared/src/config.rs` and their kin: `num`, `ms`, `rate`, `get`,
//!   `lookup`, `std::env::var`, `env_or`, `env_num`, `positive_env`, an
//!   array of names handed to one of them; `${NAME:-default}` in the
//!   scripts; `os.environ` in the Python ones) is listed under
//!   `## Settings`, and every name listed there exists; where the code states
//!   a default or a range, the page states the same;
//! * every `Parameters:` entry of template.yaml is listed under
//!   `### Template parameters` with its `Default:`, its allowed values or
//!   range, and the variables it sets;
//! * every metric the code emits is listed under `## Metrics` with its unit
//!   and the template's alarms on it, and every listed one is emitted;
//! * every key format of `shared/src/keys.rs` is named under
//!   `## Keys and items`, every key format named there is built by the
//!   code, and every attribute named there is one the code writes or reads.
//!
//! Each check returns what disagrees, one line per name, so a failure says
//! which name, which value, and where; `planted_disagreements_are_reported`
//! proves the checks catch a stale default and an unlisted variable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn reference() -> String {
    read(&root().join("docs/reference.md"))
}

fn template() -> String {
    read(&root().join("template.yaml"))
}

/// Fails with every problem, one a line.
fn assert_none(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "docs/reference.md disagrees with {what}:\n  {}",
        problems.join("\n  ")
    );
}

// ---- The sources ------------------------------------------------------

/// Where the code that reads the environment lives.
const SOURCE_ROOTS: &[&str] = &[
    "shared/src",
    "functions",
    "local/src",
    "faultproxy/src",
    "fuzz/fuzz_targets",
    "bench/lambda",
    "scripts",
];

/// Every `.rs`, `.sh` and `.py` file under [`SOURCE_ROOTS`] (build output,
/// installed packages and test-only files left out), as (path relative to
/// the repository, text).
fn sources() -> Vec<(String, String)> {
    let root = root();
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = SOURCE_ROOTS.iter().map(|r| root.join(r)).collect();
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("a directory entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if !matches!(name, "target" | "node_modules" | "tests" | "corpus") {
                    todo.push(p);
                }
                continue;
            }
            let code = p
                .extension()
                .is_some_and(|x| x == "rs" || x == "sh" || x == "py");
            if code && name != "tests.rs" {
                let rel = p.strip_prefix(&root).expect("under the root");
                out.push((rel.to_string_lossy().into_owned(), read(&p)));
            }
        }
    }
    out.sort();
    out
}

/// A Rust file without its inline `#[cfg(test)]` module (`mod tests { … }`,
/// the rest of the file in this workspace) and without its
/// whole-line comments (kept as empty lines).
fn rust_code(text: &str) -> String {
    let mut cut = text.len();
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let next = text[at + 12..].trim_start();
        // An inline test module (`mod tests;` names a file of its own,
        // left out as `tests.rs`).
        let inline = next.strip_prefix("mod ").is_some_and(|t| {
            t.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')
                .trim_start()
                .starts_with('{')
        });
        if inline {
            cut = at;
            break;
        }
        from = at + 12;
    }
    text[..cut]
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `s` looks like an environment variable's name (two characters
/// at least: `"S"` and `"N"` are DynamoDB's attribute types).
fn env_name(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() > 1
        && chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

// ---- Reading the environment, as the code does ------------------------

/// One place the code reads an environment variable: what it defaults to
/// and the range it accepts, where the code says.
#[derive(Clone, Debug, PartialEq)]
struct Read {
    name: String,
    default: Option<String>,
    min: Option<String>,
    max: Option<String>,
    /// The file.
    at: String,
}

/// The functions and closures whose first string argument names a
/// variable they read (`seconds` takes the stack's options first).
const READERS: &[&str] = &[
    "get",
    "num",
    "ms",
    "rate",
    "text",
    "table",
    "lookup",
    "var",
    "var_os",
    "env_or",
    "env_num",
    "positive_env",
    "set",
    "seconds",
];

/// Variables whose reader takes a default only to fill a type: the code
/// handles them unset before that default could apply.
const PLACEHOLDER_DEFAULTS: &[(&str, &str)] = &[(
    "STREAM_MAX_RECORD_AGE_SECS",
    "shared/src/config.rs matches unset and -1 before num(), whose 0 is never used",
)];

/// The constants of the Rust sources: name → (file, expression).
type Consts = BTreeMap<String, Vec<(String, String)>>;

fn consts(files: &[(String, String)]) -> Consts {
    let mut out = Consts::new();
    for (at, text) in files.iter().filter(|(p, _)| p.ends_with(".rs")) {
        let code = rust_code(text);
        let mut rest = code.as_str();
        while let Some(i) = rest.find("const ") {
            let after = &rest[i + 6..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let tail = &after[name.len()..];
            if env_name(&name)
                && tail.trim_start().starts_with(':')
                && let (Some(eq), Some(end)) = (tail.find('='), tail.find(';'))
                && eq < end
            {
                let expr = tail[eq + 1..end].trim().to_owned();
                out.entry(name.clone())
                    .or_default()
                    .push((at.clone(), expr));
            }
            rest = &after[name.len()..];
        }
    }
    out
}

/// A number of the code, integer arithmetic where no float takes part.
#[derive(Clone, Copy, Debug)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn f(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(x) => x,
        }
    }

    fn show(self) -> String {
        match self {
            Num::Int(i) => i.to_string(),
            Num::Float(x) if x.fract() == 0.0 && x.abs() < 1e15 => (x as i128).to_string(),
            Num::Float(x) => x.to_string(),
        }
    }

    fn op(self, op: char, b: Num) -> Option<Num> {
        Some(match (self, b) {
            (Num::Int(x), Num::Int(y)) => Num::Int(match op {
                '+' => x.checked_add(y)?,
                '-' => x.checked_sub(y)?,
                '*' => x.checked_mul(y)?,
                '/' => x.checked_div(y)?,
                _ => return None,
            }),
            (a, b) => Num::Float(match op {
                '+' => a.f() + b.f(),
                '-' => a.f() - b.f(),
                '*' => a.f() * b.f(),
                '/' => a.f() / b.f(),
                _ => return None,
            }),
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(String),
    Ident(String),
    Op(char),
}

/// The tokens of a constant expression (`2_000`, `30 * 86_400`,
/// `crate::keys::MAX_CHUNK_REELS as u64`, `Duration::from_secs(10)`):
/// paths by their last segment, `as T` and `.into()` dropped. `None` for
/// anything else (a string, a macro, a method call).
fn tokens(expr: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() || c == '&' {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_digit() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            let digits: String = chars[start..i].iter().filter(|c| **c != '_').collect();
            // A type suffix: `8000u16`, `2.0f64`.
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
            out.push(Tok::Num(digits));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let path: String = chars[start..i].iter().collect();
            let last = path.rsplit("::").next().unwrap_or("").to_owned();
            if last == "as" {
                // `as u64`: the type goes too.
                while i < chars.len() && chars[i].is_whitespace() {
                    i += 1;
                }
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            } else {
                out.push(Tok::Ident(last));
            }
        } else if c == '.' {
            let rest: String = chars[i..].iter().collect();
            if !rest.starts_with(".into()") {
                return None;
            }
            i += 7;
        } else if "+-*/()".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// Evaluates constant expressions of file `at` with `consts`.
struct Eval<'a> {
    consts: &'a Consts,
    at: &'a str,
    depth: u32,
}

impl Eval<'_> {
    fn expr(&self, text: &str) -> Option<Num> {
        if self.depth > 8 {
            return None;
        }
        let toks = tokens(text)?;
        let mut pos = 0;
        let v = self.sum(&toks, &mut pos)?;
        (pos == toks.len()).then_some(v)
    }

    fn sum(&self, t: &[Tok], pos: &mut usize) -> Option<Num> {
        let mut v = self.product(t, pos)?;
        while let Some(Tok::Op(op @ ('+' | '-'))) = t.get(*pos) {
            *pos += 1;
            v = v.op(*op, self.product(t, pos)?)?;
        }
        Some(v)
    }

    fn product(&self, t: &[Tok], pos: &mut usize) -> Option<Num> {
        let mut v = self.factor(t, pos)?;
        while let Some(Tok::Op(op @ ('*' | '/'))) = t.get(*pos) {
            *pos += 1;
            v = v.op(*op, self.factor(t, pos)?)?;
        }
        Some(v)
    }

    fn factor(&self, t: &[Tok], pos: &mut usize) -> Option<Num> {
        let tok = t.get(*pos)?.clone();
        *pos += 1;
        match tok {
            Tok::Op('-') => Num::Int(0).op('-', self.factor(t, pos)?),
            Tok::Op('(') => {
                let v = self.sum(t, pos)?;
                if t.get(*pos) != Some(&Tok::Op(')')) {
                    return None;
                }
                *pos += 1;
                Some(v)
            }
            Tok::Num(n) if n.contains('.') => n.parse().ok().map(Num::Float),
            Tok::Num(n) => n.parse().ok().map(Num::Int),
            // `f64::from(x)`, `Duration::from_secs(x)`: the value itself.
            Tok::Ident(_) if t.get(*pos) == Some(&Tok::Op('(')) => self.factor(t, pos),
            Tok::Ident(name) if name == "ZERO" => Some(Num::Int(0)),
            Tok::Ident(name) => {
                let defs = self.consts.get(&name)?;
                let def = defs
                    .iter()
                    .find(|(file, _)| file.as_str() == self.at)
                    .or_else(|| defs.iter().find(|(file, _)| file.ends_with("keys.rs")))
                    .or_else(|| (defs.len() == 1).then(|| &defs[0]))?;
                Eval {
                    consts: self.consts,
                    at: &def.0,
                    depth: self.depth + 1,
                }
                .expr(&def.1)
            }
            Tok::Op(_) => None,
        }
    }
}

/// A default or bound as the code writes it: a string literal's text, or
/// a constant expression's value.
fn value_of(arg: &str, eval: &Eval) -> Option<String> {
    let arg = arg.trim();
    if let Some(s) = arg.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return Some(s.to_owned());
    }
    eval.expr(arg).map(Num::show)
}

/// `i`, or the nearest char boundary of `s` below it.
fn floor(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The end (exclusive) of the string literal that opens at `at`.
fn literal_end(b: &[u8], at: usize) -> usize {
    let mut i = at + 1;
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    (i + 1).min(b.len())
}

/// The opener (`(` or `[`) enclosing position `at`, looking back no
/// further than the statement.
fn opener(b: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0;
    let mut i = at;
    while i > 0 && at - i < 400 {
        i -= 1;
        match b[i] {
            b')' | b']' => depth += 1,
            b'(' | b'[' if depth == 0 => return Some(i),
            b'(' | b'[' => depth -= 1,
            b';' | b'{' | b'}' => return None,
            _ => {}
        }
    }
    None
}

/// The arguments of the call or array whose opener is at `open`, split at
/// its top-level commas, and the position after its closer.
fn arguments(b: &[u8], open: usize) -> (Vec<String>, usize) {
    let mut args = Vec::new();
    let mut depth = 0;
    let mut start = open + 1;
    let mut i = open + 1;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i = literal_end(b, i);
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => {
                args.push(String::from_utf8_lossy(&b[start..i]).trim().to_owned());
                return (args.into_iter().filter(|a| !a.is_empty()).collect(), i + 1);
            }
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                args.push(String::from_utf8_lossy(&b[start..i]).trim().to_owned());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    (args, b.len())
}

/// A default the code states after the read instead of in it:
/// `.unwrap_or_else(|| "x".into())`, `.unwrap_or_default()` (empty),
/// `match … { None => 0.0,` or `None | Some("") | Some("x") =>`.
fn default_after(after: &str) -> Option<String> {
    let statement = &after[..after.find(';').unwrap_or(after.len())];
    for pat in [
        ".unwrap_or_else(|| \"",
        ".unwrap_or_else(|_| \"",
        ".unwrap_or(\"",
    ] {
        if let Some(i) = statement.find(pat) {
            let rest = &statement[i + pat.len()..];
            return rest.find('"').map(|e| rest[..e].to_owned());
        }
    }
    if statement.contains(".unwrap_or_default()") {
        return Some(String::new());
    }
    let pat = "None | Some(\"\") | Some(\"";
    if let Some(i) = after.find(pat) {
        let rest = &after[i + pat.len()..];
        return rest.find('"').map(|e| rest[..e].to_owned());
    }
    let opening = after.trim_start();
    let body = opening.strip_prefix('{').unwrap_or(opening).trim_start();
    let body = body
        .strip_prefix(".filter(|v| !v.trim().is_empty())")
        .map(|b| b.trim_start().trim_start_matches('{').trim_start())
        .unwrap_or(body);
    body.strip_prefix("None =>").map(|v| {
        v.trim_start()
            .split([',', '\n'])
            .next()
            .unwrap_or("")
            .trim()
            .to_owned()
    })
}

/// The reads of one Rust file.
fn rust_reads(at: &str, text: &str, consts: &Consts) -> Vec<Read> {
    let code = rust_code(text);
    let b = code.as_bytes();
    let eval = Eval {
        consts,
        at,
        depth: 0,
    };
    // (position, read, end of its call) of every read, in order.
    let mut found: Vec<(usize, Read, usize)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'"' {
            i += 1;
            continue;
        }
        // A char literal `'"'`, and a raw string, whose quotes open nothing.
        if i > 0 && b[i - 1] == b'\'' && b.get(i + 1) == Some(&b'\'') {
            i += 2;
            continue;
        }
        if i > 1 && b[i - 1] == b'#' && b[i - 2] == b'r' {
            i = code[i + 1..].find("\"#").map_or(b.len(), |e| i + 1 + e + 2);
            continue;
        }
        let end = literal_end(b, i);
        if end <= i + 1 {
            break;
        }
        let name = String::from_utf8_lossy(&b[i + 1..end - 1]).into_owned();
        if !env_name(&name) {
            i = end;
            continue;
        }
        let Some(open) = opener(b, i) else {
            i = end;
            continue;
        };
        let (args, close) = arguments(b, open);
        let quoted = format!("\"{name}\"");
        let read = |default, min, max| Read {
            name: name.clone(),
            default,
            min,
            max,
            at: at.to_owned(),
        };
        if b[open] == b'[' {
            // An array of names, each handed to a reader just after.
            let all_names = args.iter().all(|a| {
                a.strip_prefix('"')
                    .and_then(|a| a.strip_suffix('"'))
                    .is_some_and(env_name)
            });
            let soon = &code[close..floor(&code, close + 300)];
            if all_names
                && ["var(", "lookup(", "var_os("]
                    .iter()
                    .any(|r| soon.contains(r))
            {
                found.push((i, read(None, None, None), close));
            }
            i = end;
            continue;
        }
        let caller: String = code[..open]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let Some(k) = args.iter().position(|a| *a == quoted) else {
            i = end;
            continue;
        };
        let first_string = args[..k].iter().all(|a| !a.contains('"'));
        if !READERS.contains(&caller.as_str()) || !first_string {
            i = end;
            continue;
        }
        let rest: Vec<Option<String>> = args[k + 1..].iter().map(|a| value_of(a, &eval)).collect();
        let r = match rest.as_slice() {
            [] => read(None, None, None),
            [d] => read(d.clone(), None, None),
            // `ViewsConfig::from_lookup`'s `num(name, default, max)` takes
            // 1..=max.
            [d, max] => read(d.clone(), Some("1".into()), max.clone()),
            [d, min, max, ..] => read(d.clone(), min.clone(), max.clone()),
        };
        found.push((i, r, close));
        i = end;
    }
    // Defaults stated after the read, up to the next read.
    let starts: Vec<usize> = found.iter().map(|(p, _, _)| *p).collect();
    found
        .into_iter()
        .enumerate()
        .map(|(n, (_, mut r, close))| {
            if r.default.is_none() {
                let next = starts
                    .get(n + 1)
                    .copied()
                    .filter(|s| *s > close)
                    .unwrap_or(code.len());
                let stop = floor(&code, next.min(close + 800));
                r.default = default_after(&code[close.min(stop)..stop])
                    .map(|d| value_of(&d, &eval).unwrap_or(d));
            }
            r
        })
        .collect()
}

/// The reads of a shell script: `${NAME:-default}` (and `${NAME-…}`)
/// outside comments.
fn shell_reads(at: &str, text: &str) -> Vec<Read> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(i) = rest.find("${") {
            rest = &rest[i + 2..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let tail = &rest[name.len()..];
            let Some(body) = tail.strip_prefix(":-").or_else(|| tail.strip_prefix('-')) else {
                continue;
            };
            if !env_name(&name) {
                continue;
            }
            let mut depth = 0;
            let end = body
                .char_indices()
                .find(|(_, c)| match c {
                    '{' => {
                        depth += 1;
                        false
                    }
                    '}' if depth == 0 => true,
                    '}' => {
                        depth -= 1;
                        false
                    }
                    _ => false,
                })
                .map_or(body.len(), |(i, _)| i);
            out.push(Read {
                name,
                default: Some(body[..end].to_owned()),
                min: None,
                max: None,
                at: at.to_owned(),
            });
        }
    }
    out
}

/// The reads of a Python script: `os.environ.get("X"[, "default"])`,
/// `os.environ["X"]`, `os.getenv("X"[, "default"])`.
fn python_reads(at: &str, text: &str) -> Vec<Read> {
    let mut out = Vec::new();
    for pat in ["os.environ.get(\"", "os.environ[\"", "os.getenv(\""] {
        let mut rest = text;
        while let Some(i) = rest.find(pat) {
            rest = &rest[i + pat.len()..];
            let Some(e) = rest.find('"') else { break };
            let name = rest[..e].to_owned();
            let after = rest[e + 1..].trim_start();
            let default = after
                .strip_prefix(',')
                .map(str::trim_start)
                .and_then(|a| a.strip_prefix('"'))
                .and_then(|a| a.find('"').map(|q| a[..q].to_owned()));
            if env_name(&name) {
                out.push(Read {
                    name,
                    default,
                    min: None,
                    max: None,
                    at: at.to_owned(),
                });
            }
        }
    }
    out
}

/// Every read of the sources.
fn code_reads(files: &[(String, String)]) -> Vec<Read> {
    let consts = consts(files);
    let mut out = Vec::new();
    for (at, text) in files {
        if at.ends_with(".rs") {
            out.extend(rust_reads(at, text, &consts));
        } else if at.ends_with(".sh") {
            out.extend(shell_reads(at, text));
        } else if at.ends_with(".py") {
            out.extend(python_reads(at, text));
        }
    }
    out
}

// ---- The page -----------------------------------------------------------

/// A Markdown table of the page, under its `##` and `###` headings.
#[derive(Debug)]
struct Table {
    h2: String,
    h3: String,
    header: Vec<String>,
    /// (line number, cells)
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }
}

fn cells(line: &str) -> Vec<String> {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t.strip_suffix('|').unwrap_or(t);
    t.split('|').map(|c| c.trim().to_owned()).collect()
}

fn tables(text: &str) -> Vec<Table> {
    let (mut h2, mut h3) = (String::new(), String::new());
    let mut out: Vec<Table> = Vec::new();
    let mut in_table = false;
    for (n, line) in text.lines().enumerate() {
        if let Some(h) = line.strip_prefix("## ") {
            (h2, h3) = (h.trim().to_owned(), String::new());
        } else if let Some(h) = line.strip_prefix("### ") {
            h3 = h.trim().to_owned();
        }
        if !line.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table {
            in_table = true;
            out.push(Table {
                h2: h2.clone(),
                h3: h3.clone(),
                header: cells(line),
                rows: Vec::new(),
            });
        } else if !line.contains("---") {
            out.last_mut()
                .expect("a table")
                .rows
                .push((n + 1, cells(line)));
        }
    }
    out
}

/// The code spans of a cell, in order.
fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// A row's name: the first code span of its first cell.
fn row_name(cells: &[String]) -> String {
    spans(&cells[0]).into_iter().next().unwrap_or_default()
}

/// What a default cell states: `None` for no default (`—`, `(required)`),
/// else the code span it starts with, or its first word.
fn stated(cell: &str) -> Option<String> {
    let c = cell.trim();
    if c.is_empty() || c.starts_with('—') || c.starts_with("(required)") {
        return None;
    }
    if c.starts_with('`') {
        return spans(c).into_iter().next();
    }
    c.split_whitespace().next().map(str::to_owned)
}

/// Whether two stated values are the same: numerically if both are
/// numbers (`300` = `300.0`, `2_000` = `2000`), else as text.
fn same(a: &str, b: &str) -> bool {
    let n = |s: &str| s.replace('_', "").parse::<f64>().ok();
    match (n(a), n(b)) {
        (Some(x), Some(y)) => (x - y).abs() < 1e-9 * x.abs().max(1.0),
        _ => a == b,
    }
}

/// The `A–B` range a cell states (en dash; `-1–604800` too), if any.
fn range(cell: &str) -> Option<(String, String)> {
    let dash = cell.find('–')?;
    let before = &cell[..dash];
    let digits = before.len()
        - before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .map(char::len_utf8)
            .sum::<usize>();
    let start = if before[..digits].ends_with('-') {
        digits - 1
    } else {
        digits
    };
    let after = &cell[dash + '–'.len_utf8()..];
    let hi: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
    let lo = &before[start..];
    (!lo.is_empty() && !hi.is_empty()).then(|| (lo.to_owned(), hi))
}

// ---- Settings -------------------------------------------------------------

/// What disagrees between the page's settings tables and the code's reads;
/// `corpus` is where a listed name the readers do not find must appear.
fn check_settings(reference: &str, reads: &[Read], corpus: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut listed: BTreeMap<String, usize> = BTreeMap::new();
    for t in tables(reference)
        .into_iter()
        .filter(|t| t.h2 == "Settings" && t.h3 != "Template parameters")
    {
        let (default_col, range_col) = (t.column("default"), t.column("range"));
        for (line, row) in &t.rows {
            let name = row_name(row);
            if !env_name(&name) {
                problems.push(format!(
                    "line {line}: the first cell names no variable: {:?}",
                    row[0]
                ));
                continue;
            }
            if let Some(first) = listed.insert(name.clone(), *line) {
                problems.push(format!(
                    "`{name}` is listed twice (lines {first} and {line})"
                ));
            }
            let known = reads.iter().any(|r| r.name == name) || word_in(corpus, &name);
            if !known {
                problems.push(format!(
                    "`{name}` (line {line}) is read nowhere in the code, the scripts or the template"
                ));
            }
            if t.h3 == "Platform" {
                continue;
            }
            let said = default_col.and_then(|c| row.get(c)).map(|c| stated(c));
            let placeholder = PLACEHOLDER_DEFAULTS.iter().any(|(n, _)| *n == name);
            for r in reads.iter().filter(|r| r.name == name) {
                match (&said, &r.default) {
                    (Some(s), Some(d)) if !placeholder => {
                        let agree = match s {
                            None => d.is_empty(),
                            Some(s) => !d.is_empty() && same(s, d),
                        };
                        if !agree {
                            problems.push(format!(
                                "`{name}`: docs/reference.md line {line} says default {}, but {} says {}",
                                s.as_deref().unwrap_or("none"),
                                r.at,
                                if d.is_empty() { "none (empty)" } else { d }
                            ));
                        }
                    }
                    _ => {}
                }
                let (Some(min), Some(max)) = (&r.min, &r.max) else {
                    continue;
                };
                match range_col.and_then(|c| row.get(c)).and_then(|c| range(c)) {
                    Some((lo, hi)) if same(&lo, min) && same(&hi, max) => {}
                    Some((lo, hi)) => problems.push(format!(
                        "`{name}`: docs/reference.md line {line} says range {lo}–{hi}, but {} says {min}–{max}",
                        r.at
                    )),
                    None => problems.push(format!(
                        "`{name}`: docs/reference.md line {line} states no range, but {} says {min}–{max}",
                        r.at
                    )),
                }
            }
        }
    }
    let mut unlisted = BTreeMap::new();
    for r in reads {
        if !listed.contains_key(&r.name) {
            unlisted
                .entry(r.name.clone())
                .or_insert_with(|| r.at.clone());
        }
    }
    for (name, at) in unlisted {
        problems.push(format!(
            "`{name}` is read by {at} but not listed under ## Settings in docs/reference.md"
        ));
    }
    problems
}

/// Whether `word` occurs in `text` delimited by non-name characters.
fn word_in(text: &str, word: &str) -> bool {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_name) && !after.is_some_and(is_name)
    })
}

fn corpus(files: &[(String, String)]) -> String {
    let mut all: String = files.iter().map(|(_, t)| t.as_str()).collect();
    all.push_str(&template());
    all
}

#[test]
fn every_variable_the_code_reads_is_listed_with_its_default_and_range() {
    let files = sources();
    let reads = code_reads(&files);
    assert!(
        reads.len() > 100,
        "found only {} reads: the readers changed shape",
        reads.len()
    );
    // The readers this test knows find the configuration's own.
    for name in [
        "CACHE_TTL_MS",
        "VIEWER_VIEWS_PER_MIN",
        "LOCAL_VIEWS_SHARDS",
        "FUZZ_SECONDS",
    ] {
        assert!(reads.iter().any(|r| r.name == name), "{name} not found");
    }
    assert_none(
        "the code's reads",
        &check_settings(&reference(), &reads, &corpus(&files)),
    );
}

// ---- Template parameters --------------------------------------------------

#[derive(Debug, Default)]
struct Param {
    name: String,
    default: Option<String>,
    min: Option<String>,
    max: Option<String>,
    allowed: Vec<String>,
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
        .to_owned()
}

/// The `Parameters:` entries of the template.
fn template_params(template: &str) -> Vec<Param> {
    let mut out: Vec<Param> = Vec::new();
    let mut inside = false;
    let mut list = false;
    for line in template.lines() {
        if !line.starts_with(' ') && !line.is_empty() && !line.starts_with('#') {
            inside = line.trim_end() == "Parameters:";
            continue;
        }
        if !inside || line.trim_start().starts_with('#') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if indent == 2 && t.ends_with(':') {
            out.push(Param {
                name: t.trim_end_matches(':').to_owned(),
                ..Param::default()
            });
            list = false;
            continue;
        }
        let Some(p) = out.last_mut() else { continue };
        if indent == 6 && list {
            if let Some(v) = t.strip_prefix("- ") {
                p.allowed.push(unquote(v));
            }
            continue;
        }
        list = false;
        if let Some((key, value)) = t.split_once(':') {
            let value = value.trim();
            match key {
                "Default" => p.default = Some(unquote(value)),
                "MinValue" => p.min = Some(value.to_owned()),
                "MaxValue" => p.max = Some(value.to_owned()),
                "AllowedValues" if value.is_empty() => list = true,
                "AllowedValues" => {
                    p.allowed = value
                        .trim_matches(|c| c == '[' || c == ']')
                        .split(',')
                        .map(unquote)
                        .collect()
                }
                _ => {}
            }
        }
    }
    out
}

/// The function variables the template sets from `param`.
fn sets(template: &str, param: &str) -> BTreeSet<String> {
    let reference = format!("!Ref {param}");
    template
        .lines()
        .filter_map(|l| {
            let (key, value) = l.trim().split_once(':')?;
            let refs = value.match_indices(&reference).any(|(i, _)| {
                !value[i + reference.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
            });
            (env_name(key) && refs).then(|| key.to_owned())
        })
        .collect()
}

fn check_template_params(reference: &str, template: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let params = template_params(template);
    let table = tables(reference)
        .into_iter()
        .find(|t| t.h2 == "Settings" && t.h3 == "Template parameters");
    let Some(table) = table else {
        return vec!["no table under ### Template parameters".into()];
    };
    let col = |name: &str| table.column(name).unwrap_or(usize::MAX);
    let (default_col, allowed_col, sets_col) = (col("default"), col("allowed"), col("sets"));
    let mut listed = BTreeSet::new();
    for (line, row) in &table.rows {
        let name = row_name(row);
        listed.insert(name.clone());
        let Some(p) = params.iter().find(|p| p.name == name) else {
            problems.push(format!(
                "`{name}` (line {line}) is not a parameter of template.yaml"
            ));
            continue;
        };
        let cell = |c: usize| row.get(c).map(String::as_str).unwrap_or("");
        let said = stated(cell(default_col)).map(|s| unquote(&s));
        if said != p.default {
            problems.push(format!(
                "`{name}`: docs/reference.md line {line} says default {}, but template.yaml says {}",
                said.as_deref().unwrap_or("none"),
                p.default.as_deref().unwrap_or("none")
            ));
        }
        let allowed = cell(allowed_col);
        if !p.allowed.is_empty() {
            let said: BTreeSet<String> = spans(allowed).into_iter().collect();
            let template: BTreeSet<String> = p.allowed.iter().cloned().collect();
            if said != template {
                problems.push(format!(
                    "`{name}`: docs/reference.md line {line} allows {said:?}, template.yaml {template:?}"
                ));
            }
        }
        let bound_ok = match (&p.min, &p.max) {
            (Some(lo), Some(hi)) => {
                range(allowed).is_some_and(|(a, b)| same(&a, lo) && same(&b, hi))
            }
            (Some(lo), None) => allowed.contains(&format!("≥ {lo}")),
            (None, Some(hi)) => allowed.contains(&format!("≤ {hi}")),
            (None, None) => true,
        };
        if !bound_ok {
            problems.push(format!(
                "`{name}`: docs/reference.md line {line} allows {allowed:?}, template.yaml MinValue {} MaxValue {}",
                p.min.as_deref().unwrap_or("none"),
                p.max.as_deref().unwrap_or("none")
            ));
        }
        let said: BTreeSet<String> = spans(cell(sets_col))
            .into_iter()
            .filter(|s| env_name(s))
            .collect();
        let set = sets(template, &name);
        if said != set {
            problems.push(format!(
                "`{name}`: docs/reference.md line {line} says it sets {said:?}, template.yaml sets {set:?}"
            ));
        }
    }
    for p in &params {
        if !listed.contains(&p.name) {
            problems.push(format!(
                "template parameter `{}` is not listed under ### Template parameters",
                p.name
            ));
        }
    }
    problems
}

#[test]
fn every_template_parameter_is_listed_with_its_default() {
    let template = template();
    assert!(
        template_params(&template).len() > 40,
        "the Parameters block changed shape"
    );
    assert_none(
        "template.yaml's Parameters",
        &check_template_params(&reference(), &template),
    );
}

// ---- Metrics ----------------------------------------------------------------

/// Every metric the code emits, with its unit (`NAMES` in
/// `shared/src/metrics.rs`; a name emitted elsewhere without a unit there
/// has none).
fn emitted(files: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let metrics = files
        .iter()
        .find(|(p, _)| p == "shared/src/metrics.rs")
        .map(|(_, t)| rust_code(t))
        .expect("shared/src/metrics.rs");
    let names = &metrics[metrics.find("pub const NAMES").expect("NAMES")..];
    let names = &names[..names.find("];").expect("the end of NAMES")];
    for entry in names.split("(\"").skip(1) {
        if let Some((name, rest)) = entry.split_once('"') {
            let unit = rest
                .split("Unit::")
                .nth(1)
                .map(|u| u.chars().take_while(char::is_ascii_alphanumeric).collect())
                .unwrap_or_default();
            out.insert(name.to_owned(), unit);
        }
    }
    for (at, text) in files.iter().filter(|(p, _)| p.ends_with(".rs")) {
        if at == "shared/src/metrics.rs" {
            continue;
        }
        let code = rust_code(text);
        for call in [".count(", ".count_by(", ".sample("] {
            for (i, _) in code.match_indices(call) {
                let rest = code[i + call.len()..].trim_start();
                if let Some(rest) = rest.strip_prefix('"') {
                    let name = &rest[..rest.find('"').unwrap_or(0)];
                    out.entry(name.to_owned()).or_default();
                }
            }
        }
    }
    out
}

/// The template's alarms on the `Likes` namespace: metric → alarms.
fn alarms(template: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut resource = String::new();
    let (mut alarm, mut likes) = (false, false);
    for line in template.lines() {
        let t = line.trim();
        if line.starts_with("  ") && !line.starts_with("   ") && t.ends_with(':') {
            resource = t.trim_end_matches(':').to_owned();
            (alarm, likes) = (false, false);
        } else if t == "Type: AWS::CloudWatch::Alarm" {
            alarm = true;
        } else if t == "Namespace: Likes" {
            likes = true;
        } else if let Some(metric) = t.strip_prefix("MetricName: ")
            && alarm
            && likes
        {
            out.entry(metric.to_owned())
                .or_default()
                .insert(resource.clone());
        }
    }
    out
}

fn check_metrics(
    reference: &str,
    emitted: &BTreeMap<String, String>,
    alarms: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for t in tables(reference).into_iter().filter(|t| t.h2 == "Metrics") {
        let (unit_col, alarm_col) = (t.column("unit"), t.column("alarm"));
        for (line, row) in &t.rows {
            let name = row_name(row);
            listed.insert(name.clone());
            let Some(unit) = emitted.get(&name) else {
                problems.push(format!(
                    "metric `{name}` (line {line}) is emitted nowhere in the code"
                ));
                continue;
            };
            let said = unit_col
                .and_then(|c| row.get(c))
                .map(|c| c.replace('`', ""));
            if said.as_deref() != Some(unit.as_str()) {
                problems.push(format!(
                    "metric `{name}`: docs/reference.md line {line} says unit {said:?}, shared/src/metrics.rs says {unit:?}"
                ));
            }
            let said: BTreeSet<String> = alarm_col
                .and_then(|c| row.get(c))
                .map(|c| spans(c).into_iter().collect())
                .unwrap_or_default();
            let real = alarms.get(&name).cloned().unwrap_or_default();
            if said != real {
                problems.push(format!(
                    "metric `{name}`: docs/reference.md line {line} names alarms {said:?}, template.yaml has {real:?}"
                ));
            }
        }
    }
    for name in emitted.keys() {
        if !listed.contains(name) {
            problems.push(format!(
                "metric `{name}` is emitted but not listed under ## Metrics"
            ));
        }
    }
    problems
}

#[test]
fn every_metric_is_listed_with_its_unit_and_alarms() {
    let files = sources();
    let emitted = emitted(&files);
    assert!(emitted.len() > 40, "found only {} metrics", emitted.len());
    let alarms = alarms(&template());
    assert!(alarms.contains_key("ThrottlesGivenUp"), "{alarms:?}");
    assert_none(
        "the metrics the code emits",
        &check_metrics(&reference(), &emitted, &alarms),
    );
}

// ---- Keys and items -------------------------------------------------------

/// `{shard:03}#reel#{reel}#likes` → `{}#reel#{}#likes`.
fn shape(format: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in format.chars() {
        match c {
            '{' => {
                if depth == 0 {
                    out.push_str("{}");
                }
                depth += 1;
            }
            '}' => depth -= 1,
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The string literals of `format!` calls and `&str` constants in `code`.
fn formats(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pat in ["format!(", "&str = "] {
        for (i, _) in code.match_indices(pat) {
            let rest = code[i + pat.len()..].trim_start();
            if let Some(rest) = rest.strip_prefix('"') {
                out.insert(shape(&rest[..rest.find('"').unwrap_or(0)]));
            }
        }
    }
    out
}

/// Formats of keys.rs that are no key: a byte in hex, a UTC day, and the
/// bounds of sort-key ranges.
const NOT_KEYS: &[&str] = &["{}", "{}-{}-{}", "d#{}#", "d#{}#~", "{}#"];

fn check_keys(reference: &str, keys_rs: &str, shared: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let section = reference
        .split("\n## ")
        .find(|s| s.starts_with("Keys and items"))
        .unwrap_or("");
    let named: BTreeSet<String> = section.lines().flat_map(spans).map(|s| shape(&s)).collect();
    let keys_formats = formats(&rust_code(keys_rs));
    for f in keys_formats
        .iter()
        .filter(|f| !NOT_KEYS.contains(&f.as_str()))
    {
        if !named.contains(f) {
            problems.push(format!(
                "`{f}` of shared/src/keys.rs is named nowhere under ## Keys and items"
            ));
        }
    }
    let built: BTreeSet<String> = shared.iter().flat_map(|c| formats(c)).collect();
    let literal = |name: &str| shared.iter().any(|c| c.contains(&format!("\"{name}\"")));
    for t in tables(reference)
        .into_iter()
        .filter(|t| t.h2 == "Keys and items")
    {
        for (line, row) in &t.rows {
            for col in ["pk", "sk"] {
                let Some(cell) = t.column(col).and_then(|c| row.get(c)) else {
                    continue;
                };
                for s in spans(cell)
                    .into_iter()
                    .filter(|s| s.contains(['#', '{']) || s == "-")
                {
                    if !built.contains(&shape(&s)) {
                        problems.push(format!(
                            "key `{s}` ({}, line {line}) is built nowhere in shared/src",
                            t.h3
                        ));
                    }
                }
            }
            let Some(cell) = t.column("attributes").and_then(|c| row.get(c)) else {
                continue;
            };
            for s in spans(cell) {
                if s.contains('{') {
                    if !built.contains(&shape(&s)) {
                        problems.push(format!(
                            "attribute `{s}` ({}, line {line}) is built nowhere in shared/src",
                            t.h3
                        ));
                    }
                } else if s
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    && !literal(&s)
                {
                    problems.push(format!(
                        "attribute `{s}` ({}, line {line}) is no string of shared/src",
                        t.h3
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn every_key_format_and_attribute_is_the_codes() {
    let files = sources();
    let keys_rs = read(&root().join("shared/src/keys.rs"));
    let shared: Vec<String> = files
        .iter()
        .filter(|(p, _)| p.starts_with("shared/src") && p.ends_with(".rs"))
        .map(|(_, t)| rust_code(t))
        .collect();
    assert!(
        formats(&rust_code(&keys_rs)).len() > 15,
        "keys.rs changed shape"
    );
    assert_none(
        "the code's keys",
        &check_keys(&reference(), &keys_rs, &shared),
    );
}

// ---- The page's shape -----------------------------------------------------

#[test]
fn the_headings_other_pages_link_stay() {
    let text = reference();
    for h in [
        "## Settings",
        "### Function settings",
        "### Template parameters",
        "### Local stack",
        "## Limits",
        "## Keys and items",
        "### CountersTable",
        "### LikesTable",
        "### ViewsTable",
        "## Metrics",
        "## Glossary",
    ] {
        assert!(
            text.lines().any(|l| l.trim_end() == h),
            "docs/reference.md has no heading {h:?}"
        );
    }
}

// ---- The checks catch what they are for -----------------------------------

#[test]
fn planted_disagreements_are_reported() {
    // A page with a stale default, against code that also reads a
    // variable the page does not list.
    let page = "## Settings\n\n### Function settings\n\n\
                | variable | default | range | meaning |\n\
                | --- | --- | --- | --- |\n\
                | `CACHE_TTL_MS` | `3000` | 0–3600000 | x |\n\
                | `RETRY_MAX_MS` | `1000` | 1–50000 | x |\n";
    let code = r#"
        cache_ttl: ms("CACHE_TTL_MS", 2_000, 0, 3_600_000)?,
        retry_max: ms("RETRY_MAX_MS", 1_000, 1, 60_000)?,
        planted: num("PLANTED_KNOB", 5, 1, 9)?,
    "#;
    let reads = rust_reads("shared/src/config.rs", code, &Consts::new());
    let problems = check_settings(page, &reads, "");
    let said = |needles: &[&str]| {
        problems
            .iter()
            .any(|p| needles.iter().all(|n| p.contains(n)))
    };
    assert!(
        said(&["`CACHE_TTL_MS`", "default 3000", "says 2000"]),
        "{problems:#?}"
    );
    assert!(
        said(&["`RETRY_MAX_MS`", "range 1–50000", "1–60000"]),
        "{problems:#?}"
    );
    assert!(said(&["`PLANTED_KNOB`", "not listed"]), "{problems:#?}");
    assert_eq!(problems.len(), 3, "{problems:#?}");

    // The real page with one default made stale, and one read planted.
    let files = sources();
    let mut reads = code_reads(&files);
    let real = reference();
    let row = "| `CACHE_TTL_MS` | `2000` |";
    assert!(real.contains(row), "the CACHE_TTL_MS row changed shape");
    let stale = real.replace(row, "| `CACHE_TTL_MS` | `3000` |");
    reads.push(Read {
        name: "PLANTED_UNLISTED_MS".into(),
        default: Some("1".into()),
        min: None,
        max: None,
        at: "shared/src/config.rs".into(),
    });
    let problems = check_settings(&stale, &reads, &corpus(&files));
    let said = |needles: &[&str]| {
        problems
            .iter()
            .any(|p| needles.iter().all(|n| p.contains(n)))
    };
    assert!(
        said(&[
            "`CACHE_TTL_MS`",
            "default 3000",
            "shared/src/config.rs says 2000"
        ]),
        "{problems:#?}"
    );
    assert!(
        said(&["`PLANTED_UNLISTED_MS`", "not listed"]),
        "{problems:#?}"
    );

    // A stale template default, a dropped metric, a key the code never
    // builds.
    let template = template();
    let stale = real.replace("| `CacheTtlMs` | `2000` |", "| `CacheTtlMs` | `2500` |");
    let problems = check_template_params(&stale, &template);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`CacheTtlMs`") && p.contains("2500") && p.contains("2000")),
        "{problems:#?}"
    );
    let dropped: String = real
        .lines()
        .filter(|l| !l.starts_with("| `ViewErrors` |"))
        .map(|l| format!("{l}\n"))
        .collect();
    let problems = check_metrics(&dropped, &emitted(&files), &alarms(&template));
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`ViewErrors`") && p.contains("not listed")),
        "{problems:#?}"
    );
    let keys_rs = read(&root().join("shared/src/keys.rs"));
    let shared: Vec<String> = files
        .iter()
        .filter(|(p, _)| p.starts_with("shared/src") && p.ends_with(".rs"))
        .map(|(_, t)| rust_code(t))
        .collect();
    let wrong = real.replace("`base#reel#{reel_id}#likes`", "`base#{reel_id}#likes`");
    let problems = check_keys(&wrong, &keys_rs, &shared);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`base#{reel_id}#likes`")),
        "{problems:#?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("`base#reel#{}#likes`")),
        "{problems:#?}"
    );
}

#[test]
fn the_readers_find_defaults_wherever_the_code_states_them() {
    let mut consts = Consts::new();
    consts.insert(
        "LIMIT".into(),
        vec![("keys.rs".into(), "((TOTAL as usize) - 1) / 2".into())],
    );
    consts.insert("TOTAL".into(), vec![("keys.rs".into(), "100".into())]);
    let code = r#"
        let a = num("A_N", crate::keys::LIMIT as u64, 1, 30 * 86_400)?;
        let b = rate("B_RATE", 300.0)?;
        let c = std::env::var("C_OUT").unwrap_or_else(|_| "out.json".into());
        let d = match get("D_MODE").as_deref().map(str::trim) {
            Some("x") if y => { return Err(e); }
            None | Some("") | Some("on") => true,
        };
        let e = seconds(&opts, "E_SECS", Duration::from_secs(10))?;
        let f = match get("F_PER_SEC").filter(|v| !v.trim().is_empty()) {
            None => 0.0,
            Some(v) => v,
        };
        let g = env_num("G_PORT", 8000u16)?;
        let h = ["H_ONE", "H_TWO"].map(|k| std::env::var(k).ok());
        let i = num("I_DAYS", 35, 3_650)?;
        let j = lookup("J_SPEC").unwrap_or_default();
        let k = self.headers().get("x-user-id");
    "#;
    type Found = (Option<String>, Option<String>, Option<String>);
    let got: BTreeMap<String, Found> = rust_reads("x.rs", code, &consts)
        .into_iter()
        .map(|r| (r.name, (r.default, r.min, r.max)))
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(got["A_N"], (s("49"), s("1"), s("2592000")));
    assert_eq!(got["B_RATE"], (s("300"), None, None));
    assert_eq!(got["C_OUT"], (s("out.json"), None, None));
    assert_eq!(got["D_MODE"], (s("on"), None, None));
    assert_eq!(got["E_SECS"], (s("10"), None, None));
    assert_eq!(got["F_PER_SEC"], (s("0"), None, None));
    assert_eq!(got["G_PORT"], (s("8000"), None, None));
    assert_eq!(got["H_ONE"], (None, None, None));
    assert_eq!(got["H_TWO"], (None, None, None));
    assert_eq!(got["I_DAYS"], (s("35"), s("1"), s("3650")));
    assert_eq!(got["J_SPEC"], (s(""), None, None));
    assert_eq!(got.len(), 11, "{got:?}");
    let sh = shell_reads(
        "x.sh",
        "# ${NOT_THIS:-1}\nA=${FUZZ_X:-60} ${lower:-1} ${CARGO_HOME:-$HOME/.cargo}\n",
    );
    let names: Vec<(String, Option<String>)> =
        sh.into_iter().map(|r| (r.name, r.default)).collect();
    assert_eq!(
        names,
        [
            ("FUZZ_X".to_owned(), s("60")),
            ("CARGO_HOME".to_owned(), s("$HOME/.cargo"))
        ]
    );
    assert_eq!(range("-1, 60–604800"), Some(("60".into(), "604800".into())));
    assert_eq!(range("-1–604800"), Some(("-1".into(), "604800".into())));
    assert_eq!(stated("`2000` ms"), s("2000"));
    assert_eq!(stated("— (unset)"), None);
}
