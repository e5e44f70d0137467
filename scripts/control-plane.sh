#!/usr/bin/env bash
# Builds the real Kubernetes control plane the end-to-end suites run on with
# SHARDWISE_E2E_SERVER=real: kube-apiserver and etcd, from the Go modules pinned in
# e2e/control-plane/go.mod and go.sum, fetched by the go command from the Go module proxy.
# The binaries go to target/control-plane/ (or $SHARDWISE_CONTROL_PLANE_BIN) with a stamp of
# the inputs; a second run with the same inputs does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

module=e2e/control-plane
out=${SHARDWISE_CONTROL_PLANE_BIN:-target/control-plane}
stamp="$out/.stamp"
inputs=$(cat "$module/go.mod" "$module/go.sum" "$module"/etcd/*.go "$0" | sha256sum | cut -d' ' -f1)
if [[ -x "$out/kube-apiserver" && -x "$out/etcd" && -f "$stamp" && "$(cat "$stamp")" == "$inputs" ]]; then
    exit 0
fi

command -v go >/dev/null 2>&1 || { echo "control-plane.sh: the go command is needed (Go 1.26 or newer)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$module"
# The version kube-apiserver reports (/version, --version) is stamped in at link time, as
# Kubernetes' own build does; without it a module build says v0.0.0-master.
kubernetes=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$kubernetes" | cut -d. -f2)
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$kubernetes -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
# client-go stamps the User-Agent of the server's own requests (seen in the audit log).
cg=k8s.io/client-go/pkg/version
ldflags+=" -X $cg.gitVersion=$kubernetes -X $cg.gitMajor=1 -X $cg.gitMinor=$minor"
# The binaries are what is kept; Go's build cache of this build (about 3 GB) would only fill
# the disk of a CI machine, so it lives in a directory removed afterwards.
GOCACHE=$(mktemp -d)
export GOCACHE
trap 'chmod -R u+w "$GOCACHE" && rm -rf "$GOCACHE"' EXIT
echo "control-plane.sh: building kube-apiserver $kubernetes and etcd $(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) into $out (first time: a few minutes)" >&2
start=$(date +%s)
go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$out/" k8s.io/kubernetes/cmd/kube-apiserver ./etcd
echo "control-plane.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$inputs" > "$out/.stamp"
