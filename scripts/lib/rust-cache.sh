# shellcheck shell=bash
# Sourced by .ci/run and `make clean-cache`. Compiled crates are kept per user beside the built
# components (scripts/lib/go-build.sh), by sccache (Debian's package): each compilation is keyed
# by the crate's sources, its flags and the compiler, so a second clean clone on the same
# machine takes its dependencies from the cache and compiles only what changed. Its own server
# port keeps it apart from an sccache the user runs for other work.

shardwise_cache() {
    echo "${SHARDWISE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardwise}"
}

use_rust_cache() {
    command -v sccache >/dev/null 2>&1 || return 0
    export RUSTC_WRAPPER=sccache
    export SCCACHE_DIR=${SCCACHE_DIR:-$(shardwise_cache)/sccache}
    export SCCACHE_CACHE_SIZE=${SCCACHE_CACHE_SIZE:-8G}
    export SCCACHE_SERVER_PORT=${SCCACHE_SERVER_PORT:-4230}
}
