//! Records the commit the binary is built from, for `shardwise --version`: the short hash of
//! `git rev-parse`, or "unknown" where there is no git or no repository (the image's build
//! copies the workspace without `.git`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    // A new commit moves HEAD or the branch it names: rebuild then, and only then. Only paths
    // that exist are named, since Cargo reruns the script on every build for a missing one.
    if commit.is_some() {
        let mut refs = vec!["HEAD".to_string(), "packed-refs".to_string()];
        refs.extend(git(&["symbolic-ref", "-q", "HEAD"]));
        for name in refs {
            if let Some(path) = git(&["rev-parse", "--git-path", &name])
                && std::path::Path::new(&path).exists()
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!(
        "cargo:rustc-env=SHARDWISE_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
