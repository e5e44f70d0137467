# Sourced by the scripts that build real components from pinned Go modules
# (control-plane.sh, argocd.sh). Call as: go_build_setup <script name> <output directory>.
# It checks for the go command, creates the output directory and sets `out` to its absolute
# path, and gives the build a Go build cache of its own, removed on exit: the cache (gigabytes
# for Kubernetes) would only fill a CI machine's disk, and only the binaries are kept.
go_build_setup() {
    local script=$1
    command -v go >/dev/null 2>&1 || { echo "$script: the go command is needed (Go 1.26 or newer)" >&2; exit 1; }
    mkdir -p "$2"
    out=$(cd "$2" && pwd)
    GOCACHE=$(mktemp -d)
    export GOCACHE
    trap 'chmod -R u+w "$GOCACHE" && rm -rf "$GOCACHE"' EXIT
}
