#!/usr/bin/env bash
# Installs the pinned cargo tools of the last checks of `make test`, once per user into
# ~/.cargo/bin: cargo-machete (unused dependencies, `make machete`) and cargo-deny (licenses,
# bans and sources, `make deny`). Pinned: a new release may judge differently. Compiling both
# takes about 4 minutes of a 2-core machine, so scripts/prerequisites.sh starts this in the
# background at the lowest priority, where the suites leave the CPU idle; `make machete` and
# `make deny` run it again, which waits for an install under way (a lock) and reports a failure.
# Quick when both are there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/cargo-tools
exec 9>target/cargo-tools/.lock
flock 9

machete_version=0.9.2
if [[ "$(cargo machete --version 2>/dev/null)" != "$machete_version" ]]; then
    cargo install --quiet --locked cargo-machete --version "$machete_version"
fi
deny_version=0.20.2
if [[ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $deny_version" ]]; then
    cargo install --quiet --locked --no-default-features cargo-deny --version "$deny_version"
fi
