#!/usr/bin/env bash
# Builds Argo CD's application controller and repo server, the ground truth of shardwise's
# Argo CD suite, from github.com/argoproj/argo-cd/v3 as pinned in e2e/argocd/go.mod and go.sum
# (fetched by the go command from the Go module proxy, built as published). One binary,
# target/argocd/argocd (or $SHARDWISE_ARGOCD_BIN/argocd), runs either component as Argo CD's
# own does: by ARGOCD_BINARY_NAME; the release's CRDs and the controller's ClusterRole go to
# crds/ and rbac/ beside it. A stamp of the inputs makes a second run with the same
# inputs do nothing.
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
inputs=$(cat "$module/go.mod" "$module/go.sum" "$module"/*.go "$0" scripts/lib/go-build.sh | sha256sum | cut -d' ' -f1)
if [[ -x "$out/argocd" && -f "$stamp" && "$(cat "$stamp")" == "$inputs" ]]; then
    exit 0
fi

# shellcheck source=scripts/lib/go-build.sh
source scripts/lib/go-build.sh
go_build_setup argocd.sh "$out"
start=$(date +%s)

cd "$module"
version=$(go list -m -f '{{.Version}}' github.com/argoproj/argo-cd/v3)
# The version the components report (`--version`, the `argocd_info` metric), stamped in at link
# time as Argo CD's Makefile does.
ldflags="-s -w -X github.com/argoproj/argo-cd/v3/common.version=${version#v}"
ldflags+=" -X github.com/argoproj/argo-cd/v3/common.gitTreeState=clean"
ldflags+=" -X github.com/argoproj/argo-cd/v3/common.buildDate=1970-01-01T00:00:00Z"
echo "argocd.sh: building Argo CD $version (application controller and repo server) into $out (first time: several minutes)" >&2
CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$out/argocd" .
# The harness installs the release's own CRDs and the application controller's RBAC.
manifests="$(go list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3)/manifests"
rm -rf "$out/crds" "$out/rbac"
mkdir -p "$out/crds" "$out/rbac"
cp "$manifests"/crds/application-crd.yaml "$manifests"/crds/appproject-crd.yaml "$out/crds/"
cp "$manifests"/cluster-rbac/application-controller/argocd-application-controller-cluster*.yaml "$out/rbac/"
chmod -R u+w "$out/crds" "$out/rbac"
cd - >/dev/null

echo "argocd.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$inputs" > "$stamp"
