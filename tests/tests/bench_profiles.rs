//! The Lambda figures (`scripts/lambda-figures.sh`, `bench/lambda/`) compare
//! like with like: every baseline and benchmark crate there is its own
//! workspace, so it carries a copy of the release profile, and each copy
//! must equal the service workspace's `[profile.release]` (the settings the
//! deployed bootstraps are built with). A change to one without the others
//! fails here instead of skewing the ratios.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `key = value` lines of `[profile.release]`, comments and blank lines
/// left out, in order.
fn release_profile(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest)
        .unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
    let mut lines = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.starts_with('[') {
            inside = line == "[profile.release]";
            continue;
        }
        if inside && !line.is_empty() {
            lines.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    lines
}

#[test]
fn every_lambda_figures_crate_uses_the_workspace_release_profile() {
    let root = root();
    let workspace = release_profile(&root.join("Cargo.toml"));
    assert!(
        workspace.iter().any(|l| l.starts_with("lto")),
        "the workspace's release profile was not found: {workspace:?}"
    );
    for krate in ["hello", "hello-http", "overhead"] {
        let manifest = root.join("bench/lambda").join(krate).join("Cargo.toml");
        assert_eq!(
            release_profile(&manifest),
            workspace,
            "{} must carry the workspace's [profile.release]",
            manifest.display()
        );
    }
}
