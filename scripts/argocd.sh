#!/usr/bin/env bash
# Builds Argo CD's application controller and repo server, the ground truth of shardwise's
# Argo CD suite, from github.com/argoproj/argo-cd/v3 as pinned in e2e/argocd/go.mod and go.sum
# (fetched by the go command from the Go module proxy, built as published). One binary,
# target/argocd/argocd (or $SHARDWISE_ARGOCD_BIN/argocd), runs either component as Argo CD's
# own does: by ARGOCD_BINARY_NAME; the release's CRDs and the controller's ClusterRole go to
# crds/ and rbac/ beside it. A stamp of the inputs makes a second run with the same
# inputs do nothing; the build is kept in the per-user cache of scripts/lib/go-build.sh, so
# another clone on this machine links it instead of building it.
set -euo pipefail
cd "$(dirname "$0")/.."

module=e2e/argocd
out=${SHARDWISE_ARGOCD_BIN:-target/argocd}
stamp="$out/.stamp"
# One build at a time: a second run (`make argocd` while the one scripts/prerequisites.sh
# started in the background is under way) waits for the first, then finds it up to date.
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
# shellcheck source=scripts/lib/go-build.sh
source scripts/lib/go-build.sh
inputs=$(inputs_hash "$module/go.mod" "$module/go.sum" "$module"/*.go "$0" scripts/lib/go-build.sh)
if [[ -x "$out/argocd" && -f "$stamp" && "$(cat "$stamp")" == "$inputs" ]]; then
    exit 0
fi

build_argocd() {
    local into=$1
    cd "$module"
    local version ldflags manifests
    version=$(go list -m -f '{{.Version}}' github.com/argoproj/argo-cd/v3)
    # The version the components report (`--version`, the `argocd_info` metric), stamped in at
    # link time as Argo CD's Makefile does.
    ldflags="-s -w -X github.com/argoproj/argo-cd/v3/common.version=${version#v}"
    ldflags+=" -X github.com/argoproj/argo-cd/v3/common.gitTreeState=clean"
    ldflags+=" -X github.com/argoproj/argo-cd/v3/common.buildDate=1970-01-01T00:00:00Z"
    echo "argocd.sh: building Argo CD $version (application controller and repo server; first time on this machine: several minutes)" >&2
    CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$into/argocd" .
    # The harness installs the release's own CRDs and the application controller's RBAC.
    manifests="$(go list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3)/manifests"
    mkdir -p "$into/crds" "$into/rbac"
    cp "$manifests"/crds/application-crd.yaml "$manifests"/crds/appproject-crd.yaml "$into/crds/"
    cp "$manifests"/cluster-rbac/application-controller/argocd-application-controller-cluster*.yaml "$into/rbac/"
    chmod -R u+w "$into/crds" "$into/rbac"
    cd - >/dev/null
}

rm -rf "$out/crds" "$out/rbac"
cached_build argocd.sh argocd "$inputs" "$out" build_argocd
echo "$inputs" > "$stamp"
