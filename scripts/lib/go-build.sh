# shellcheck shell=bash
# Sourced by the scripts that build real components from pinned Go modules (control-plane.sh,
# argocd.sh). Builds are kept in a per-user cache outside the checkout, one entry per component
# and hash of its inputs, so that a second clone on the same machine links the binaries in
# seconds instead of building them again:
#
#   ${SHARDWISE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardwise}/components/<name>-<hash>/
#
# An entry is complete once its `.complete` file exists: the checksums of every file in it,
# written last, after the build, and checked before each use. A partial entry (a build cut
# off) or a corrupt one (a file changed or missing) is removed and built again. `make
# clean-cache` removes them all.

components_cache() {
    echo "${SHARDWISE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardwise}/components"
}

# inputs_hash <file>...: the hash of the files, the go command's version and the machine's
# architecture: what a build's output depends on.
inputs_hash() {
    { cat "$@"; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -d' ' -f1
}

# cached_build <script> <name> <inputs hash> <output directory> <build function>: fills the
# output directory with the component's files, from the cache entry when it is complete, else
# by calling `<build function> <directory>` to build them into a fresh directory that becomes
# the entry. Files are hard-linked from the entry where the file system allows it, else copied.
cached_build() {
    local script=$1 name=$2 inputs=$3 out=$4 build=$5
    command -v go >/dev/null 2>&1 || { echo "$script: the go command is needed (Go 1.26 or newer)" >&2; exit 1; }
    local cache entry
    cache=$(components_cache)
    mkdir -p "$cache" "$out"
    cache=$(cd "$cache" && pwd)
    entry="$cache/$name-$inputs"
    if ! entry_complete "$entry"; then
        if [[ -e "$entry" ]]; then
            echo "$script: the cached $name in $entry is partial or corrupt: building it again" >&2
            chmod -R u+w "$entry" && rm -rf "$entry"
        fi
        # Globals, not locals: the exit trap of a failed build reads them.
        cached_build_partial=$(mktemp -d "$cache/.$name-$inputs.partial.XXXXXX")
        GOCACHE=$(mktemp -d)
        export GOCACHE
        # The Go build cache (gigabytes for Kubernetes) would only fill the disk: only the
        # binaries are kept.
        trap 'chmod -R u+w "$GOCACHE" "$cached_build_partial" 2>/dev/null; rm -rf "$GOCACHE" "$cached_build_partial"' EXIT
        local start
        start=$(date +%s)
        "$build" "$cached_build_partial"
        chmod -R u+w "$GOCACHE" && rm -rf "$GOCACHE"
        (cd "$cached_build_partial" && find . -type f ! -name '.complete*' -print0 | sort -z | xargs -0 sha256sum > .complete.tmp && mv .complete.tmp .complete)
        # Another build of the same inputs may have finished first: either is good.
        mv -T "$cached_build_partial" "$entry" 2>/dev/null || { chmod -R u+w "$cached_build_partial"; rm -rf "$cached_build_partial"; }
        trap - EXIT
        echo "$script: built $name in $(( $(date +%s) - start )) s, cached in $entry" >&2
    fi
    local file
    while IFS= read -r -d '' file; do
        file=${file#./}
        mkdir -p "$out/$(dirname "$file")"
        ln -f "$entry/$file" "$out/$file" 2>/dev/null || cp -f "$entry/$file" "$out/$file"
    done < <(cd "$entry" && find . -type f ! -name '.complete*' -print0)
}

# entry_complete <entry>: whether the cache entry has its `.complete` and every file in it
# matches its checksum.
entry_complete() {
    [[ -f "$1/.complete" ]] && (cd "$1" && sha256sum --quiet --strict -c .complete >/dev/null 2>&1)
}
