//! The README and the pages under `docs/` hold together: every relative
//! link in them names a file that exists (relative to the page that links
//! it) and, for a Markdown page with an `#anchor`, a heading of that page
//! (GitHub's heading ids); every page of `docs/` is linked from the README;
//! the README stays a front door (150 to 320 lines) that opens with the two
//! commands, the second being the one CI runs. Plain text processing, no
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
