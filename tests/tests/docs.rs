//! The README and the pages under `docs/` hold together: every relative
//! link in them names a file that exists (relative to the page that links
//! it) and, for a Markdown page with an `#anchor`, a heading of that page
//! (GitHub's heading ids); every page of `docs/` is linked from the README;
//! the README stays a front door (150 to 320 lines) that opens with the two
//! commands, the second being the one CI runs; and every repository path a
//! comment of a `.rs`, `.sh` or `.py` file names exists. Plain text processing, no
//! Markdown library: links inside code (fenced blocks, `code spans`) are
//! not links and are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every docs/*.md, as paths relative to the repository root.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("a docs/ directory")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().unwrap()))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ has no .md page");
    pages.extend(docs);
    pages
}

/// The lines of a page outside fenced code blocks, with their numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A line with its code spans replaced by `code`, so that neither brackets
/// nor backticks inside them count.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let fence = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        match after.find(fence) {
            Some(end) => {
                out.push_str("code");
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links `[text](target)` and images of a page,
/// with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            // `[text](target "title")`: the target is the first word.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(|c| c == '<' || c == '>').to_owned()));
            rest = &after[end + 1..];
        }
    }
    out
}

/// GitHub's id for a heading's text: lowercase; letters, digits, `-` and
/// `_` kept; spaces become `-`; everything else dropped. Markdown markup
/// (code ticks, emphasis, link targets) is not part of the text.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut chars = heading.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' | '*' => {}
            // `[text](target)`: keep the text, drop the target.
            ']' if chars.peek() == Some(&'(') => {
                for c in chars.by_ref() {
                    if c == ')' {
                        break;
                    }
                }
            }
            _ => text.push(c),
        }
    }
    text.trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings, with GitHub's `-1`, `-2`, … for
/// repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.starts_with("//")
        || target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
}

#[test]
fn every_relative_link_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&root.join(&page));
        for (line, target) in links(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                page.clone()
            } else {
                normalize(&page.parent().unwrap_or(Path::new("")).join(file))
            };
            let at = format!("{}:{line}: ({target})", page.display());
            if !root.join(&linked).exists() {
                broken.push(format!("{at}: no file {}", linked.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && linked.extension().is_some_and(|x| x == "md")
                && !anchors(&read(&root.join(&linked))).contains(anchor)
            {
                broken.push(format!(
                    "{at}: no heading #{anchor} in {}",
                    linked.display()
                ));
            }
        }
    }
    assert!(checked > 0, "no relative link found at all");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let readme = read(&root().join("README.md"));
    let linked: BTreeSet<PathBuf> = links(&readme)
        .into_iter()
        .filter(|(_, t)| !is_external(t))
        .map(|(_, t)| normalize(Path::new(t.split('#').next().unwrap_or(""))))
        .collect();
    let missing: Vec<String> = pages()
        .into_iter()
        .skip(1)
        .filter(|p| !linked.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "docs pages the README does not link: {missing:?}"
    );
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        (150..=320).contains(&lines),
        "README.md has {lines} lines; keep it between 150 and 320 and move depth to docs/"
    );
    // It opens with the two commands, and CI runs the second one.
    let head: Vec<&str> = readme.lines().take(12).collect();
    let first_block: Vec<&str> = head
        .iter()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .copied()
        .collect();
    let commands: Vec<&str> = first_block
        .iter()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .collect();
    assert_eq!(
        commands,
        ["make serve", "make test"],
        "the README's first lines"
    );
    let ci = read(&root().join(".ci/run"));
    assert!(
        ci.lines().any(|l| l.trim() == "make test"),
        ".ci/run must run the README's test command, `make test`"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Five-minute tour"), "five-minute-tour");
    assert_eq!(
        slug("`sam local invoke` with Docker"),
        "sam-local-invoke-with-docker"
    );
    assert_eq!(slug("Cached, and for how long"), "cached-and-for-how-long");
    assert_eq!(
        slug("Regenerating BENCHMARKS.md"),
        "regenerating-benchmarksmd"
    );
    assert_eq!(slug("Deploying (SAM)"), "deploying-sam");
    assert_eq!(slug("Grow N → M"), "grow-n--m");
    assert_eq!(slug("What `make serve` does"), "what-make-serve-does");
    let text = "# A\n\n```sh\n# not a heading\n```\n\n## A\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from(["a".to_owned(), "a-1".to_owned()])
    );
    assert_eq!(
        links("[`x`](a.md#b) and `[no](link)` and ![i](img.png)\n```\n[no](code)\n```\n"),
        [(1, "a.md#b".to_owned()), (1, "img.png".to_owned())]
    );
}

/// Every file the repository tracks (and any new one not ignored), as paths
/// relative to its root: what a comment may name.
fn repository_files() -> Vec<String> {
    let out = std::process::Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root())
        .output()
        .expect("git runs (the tests run in a clone of the repository)");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .expect("utf-8 paths")
        .split('\0')
        .filter(|p| !p.is_empty() && root().join(p).exists())
        .map(str::to_owned)
        .collect()
}

/// The comment text of a source line, by the file's language: `//` in Rust,
/// `#` in shell and Python. A trailing comment counts when no string
/// literal opens before it; shebangs do not count.
fn comment_of<'a>(line: &'a str, ext: &str) -> Option<&'a str> {
    let marker = if ext == "rs" { "//" } else { "#" };
    let trimmed = line.trim_start();
    if trimmed.starts_with("#!") {
        return None;
    }
    if let Some(rest) = trimmed.strip_prefix(marker) {
        return Some(rest);
    }
    let at = line.find(&format!(" {marker} "))?;
    (!line[..at].contains(['"', '\''])).then(|| &line[at + marker.len() + 1..])
}

/// The words of a comment that name a repository path: with a `/` under
/// one of the repository's top-level folders, or ending in a source or
/// document extension. Globs, URLs, absolute and placeholder paths are
/// not names of one file.
fn named_paths(comment: &str, top: &BTreeSet<String>) -> Vec<String> {
    const EXTS: [&str; 9] = ["rs", "sh", "py", "md", "yaml", "yml", "json", "toml", "svg"];
    comment
        .split(|c: char| c.is_whitespace() || "()[]`'\",;".contains(c))
        .map(|w| w.trim_end_matches(['.', ':', '!', '?']))
        .filter(|w| {
            !w.is_empty()
                && !w.contains(['*', '{', '}', '<', '>', '$', '%', '~', '#', '=', '|', '@'])
                && !w.contains("://")
                && !w.starts_with('/')
                && !w.starts_with('-')
        })
        .filter(|w| {
            let first = w.split('/').next().unwrap_or("");
            let ext = Path::new(w).extension().and_then(|e| e.to_str());
            (w.contains('/') && top.contains(first)) || ext.is_some_and(|e| EXTS.contains(&e))
        })
        .map(str::to_owned)
        .collect()
}

/// Comments name files that exist: every repository path named in a
/// comment of a `.rs`, `.sh` or `.py` file resolves, from the repository
/// root, from the commenting file's folder, or as the tail of a tracked
/// path (`store/dynamodb/mod.rs`, `mod.rs`); outputs that git ignores
/// (`target/…`) are not checked. A file moved or split without its
/// mentions fails here.
#[test]
fn every_path_named_in_a_comment_exists() {
    let root = root();
    let files = repository_files();
    let dirs: BTreeSet<String> = files
        .iter()
        .flat_map(|f| {
            let mut d = Vec::new();
            let mut p = Path::new(f).parent();
            while let Some(x) = p.filter(|x| !x.as_os_str().is_empty()) {
                d.push(format!("{}/", x.display()));
                p = x.parent();
            }
            d
        })
        .collect();
    let top: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.split_once('/').map(|(t, _)| t.to_owned()))
        .collect();
    let exists = |from: &str, named: &str| {
        let bare = named.trim_end_matches('/');
        let dir = Path::new(from).parent().unwrap_or(Path::new(""));
        root.join(bare).exists()
            || root.join(normalize(&dir.join(bare))).exists()
            || files.iter().chain(dirs.iter()).any(|f| {
                f.trim_end_matches('/') == bare
                    || f.trim_end_matches('/').ends_with(&format!("/{bare}"))
            })
    };
    // What git ignores (target/, fuzz/artifacts/, …) is output a comment
    // may name before it exists, not a repository file.
    let ignored = |named: &str| {
        let bare = named.trim_end_matches('/');
        [bare.to_owned(), format!("{bare}/")].iter().any(|p| {
            std::process::Command::new("git")
                .args(["check-ignore", "-q", "--no-index", p])
                .current_dir(&root)
                .status()
                .is_ok_and(|s| s.success())
        })
    };
    let mut stale = Vec::new();
    let mut checked = 0;
    for file in &files {
        let Some(ext) = Path::new(file).extension().and_then(|e| e.to_str()) else {
            continue;
        };
        if !["rs", "sh", "py"].contains(&ext) {
            continue;
        }
        for (n, line) in read(&root.join(file)).lines().enumerate() {
            let Some(comment) = comment_of(line, ext) else {
                continue;
            };
            for named in named_paths(comment, &top) {
                checked += 1;
                if !exists(file, &named) && !ignored(&named) {
                    stale.push(format!("{file}:{}: {named}", n + 1));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} paths found in comments");
    assert!(
        stale.is_empty(),
        "comments name paths that do not exist:\n{}",
        stale.join("\n")
    );
}
