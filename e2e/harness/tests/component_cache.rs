//! The per-user cache of built real components (scripts/lib/go-build.sh): a second build of the
//! same inputs links the cached files without building, and a partial or corrupt entry is
//! built again. Driven through bash with a stand-in build that counts its runs.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cached_build` for a component `demo` whose build writes `bin/tool` and `data/note`
/// and appends a line to `runs` each time it runs; `inputs` is the inputs hash.
fn build(cache: &Path, out: &Path, runs: &Path, inputs: &str) {
    let script = format!(
        r#"set -euo pipefail
source scripts/lib/go-build.sh
build_demo() {{
    mkdir -p "$1/bin" "$1/data"
    printf 'tool %s\n' "{inputs}" > "$1/bin/tool"
    printf 'note\n' > "$1/data/note"
    echo run >> "{runs}"
}}
cached_build test demo "{inputs}" "{out}" build_demo
"#,
        runs = runs.display(),
        out = out.display(),
    );
    let output = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(repo())
        .env("SHARDWISE_CACHE_DIR", cache)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cached_build failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn runs(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

#[test]
fn a_cached_build_is_linked_and_a_partial_or_corrupt_one_built_again() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, runs_file) = (dir.path().join("cache"), dir.path().join("runs"));
    let entry = cache.join("components/demo-aaa");
    let (first, second) = (dir.path().join("clone1"), dir.path().join("clone2"));

    build(&cache, &first, &runs_file, "aaa");
    assert_eq!(runs(&runs_file), 1, "the first build runs");
    assert_eq!(
        std::fs::read_to_string(first.join("bin/tool")).unwrap(),
        "tool aaa\n"
    );
    assert!(entry.join(".complete").is_file(), "the entry is stamped");

    // Another clone, same inputs: the files come from the cache.
    build(&cache, &second, &runs_file, "aaa");
    assert_eq!(runs(&runs_file), 1, "a complete entry is not built again");
    assert_eq!(
        std::fs::read_to_string(second.join("data/note")).unwrap(),
        "note\n"
    );

    // Other inputs: another entry.
    build(&cache, &second, &runs_file, "bbb");
    assert_eq!(runs(&runs_file), 2, "new inputs build");
    assert_eq!(
        std::fs::read_to_string(second.join("bin/tool")).unwrap(),
        "tool bbb\n"
    );

    // A corrupt entry (a file changed after the stamp): built again, the right content back.
    let cached = entry.join("bin/tool");
    std::fs::remove_file(&cached).unwrap();
    std::fs::write(&cached, "garbage\n").unwrap();
    build(&cache, &first, &runs_file, "aaa");
    assert_eq!(runs(&runs_file), 3, "a corrupt entry is built again");
    assert_eq!(
        std::fs::read_to_string(first.join("bin/tool")).unwrap(),
        "tool aaa\n"
    );

    // A partial entry (a build cut off before its stamp): built again.
    std::fs::remove_file(entry.join(".complete")).unwrap();
    build(&cache, &first, &runs_file, "aaa");
    assert_eq!(
        runs(&runs_file),
        4,
        "an entry without its stamp is built again"
    );
    assert!(entry.join(".complete").is_file());

    // A missing file is corrupt too.
    std::fs::remove_file(entry.join("data/note")).unwrap();
    build(&cache, &second, &runs_file, "aaa");
    assert_eq!(
        runs(&runs_file),
        5,
        "an entry missing a file is built again"
    );
}
