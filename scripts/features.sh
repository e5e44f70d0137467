#!/usr/bin/env bash
# The runtime as a library (`make features`): without its default features it builds without
# warnings and links no clap, HTTP server, TLS stack, procfs or tracing-subscriber; the
# planner's crate, which reads fleets from outside, links no HTTP server or procfs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo="${CARGO:-cargo}"

# `name` appears in `tree` as a package of its own (`├── name v1.2.3`).
refuse() {
    local tree="$1" what="$2"
    shift 2
    for name in "$@"; do
        if grep -Eq "(^|[ ─])${name} v[0-9]" <<<"$tree"; then
            echo "features.sh: $what links $name" >&2
            exit 1
        fi
    done
}

runtime=$("$cargo" tree --locked -p shardwise-runtime --no-default-features -e normal)
refuse "$runtime" "shardwise-runtime without default features" clap axum rustls procfs tracing-subscriber
plan=$("$cargo" tree --locked -p shardwise-plan -e normal)
refuse "$plan" "shardwise-plan" axum procfs
"$cargo" clippy --locked -p shardwise-runtime --no-default-features -- -D warnings
echo "features.sh: the runtime without its default features builds and links none of its batteries"
