#!/usr/bin/env bash
# Builds the real Kubernetes control plane the end-to-end suites run on: kube-apiserver,
# kube-controller-manager, kube-scheduler and etcd from the Go modules pinned in
# e2e/control-plane/go.mod and go.sum, and helm from e2e/helm/go.mod and go.sum, fetched by the
# go command from the Go module proxy. The binaries go to target/control-plane/ (or
# $SHARDWISE_CONTROL_PLANE_BIN) with a stamp of the inputs; a second run with the same inputs
# does nothing. Each build is kept in the per-user cache of scripts/lib/go-build.sh, so another
# clone on this machine links the binaries instead of building them.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/go-build.sh
source scripts/lib/go-build.sh

module=e2e/control-plane
helm_module=e2e/helm
out=${SHARDWISE_CONTROL_PLANE_BIN:-target/control-plane}
stamp="$out/.stamp"
binaries=(kube-apiserver kube-controller-manager kube-scheduler etcd helm)
control_plane_inputs=$(inputs_hash "$module/go.mod" "$module/go.sum" "$module"/etcd/*.go "$0" scripts/lib/go-build.sh)
helm_inputs=$(inputs_hash "$helm_module/go.mod" "$helm_module/go.sum" "$0" scripts/lib/go-build.sh)
inputs="$control_plane_inputs $helm_inputs"
up_to_date() {
    local binary
    for binary in "${binaries[@]}"; do
        [[ -x "$out/$binary" ]] || return 1
    done
    [[ -f "$stamp" && "$(cat "$stamp")" == "$inputs" ]]
}
if up_to_date; then
    exit 0
fi

build_control_plane() {
    local into=$1
    cd "$module"
    # The version the Kubernetes binaries report (/version, --version) is stamped in at link
    # time, as Kubernetes' own build does; without it a module build says v0.0.0-master.
    local kubernetes minor pkg ldflags cg
    kubernetes=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
    minor=$(echo "$kubernetes" | cut -d. -f2)
    pkg=k8s.io/component-base/version
    ldflags="-s -w -X $pkg.gitVersion=$kubernetes -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    # client-go stamps the User-Agent of the servers' own requests (seen in the audit log).
    cg=k8s.io/client-go/pkg/version
    ldflags+=" -X $cg.gitVersion=$kubernetes -X $cg.gitMajor=1 -X $cg.gitMinor=$minor"
    echo "control-plane.sh: building kube-apiserver, kube-controller-manager and kube-scheduler $kubernetes and etcd $(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) (first time on this machine: several minutes)" >&2
    go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$into/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler \
        ./etcd
    cd - >/dev/null
}

build_helm() {
    local into=$1
    cd "$helm_module"
    # helm's own Makefile stamps its version, an empty build metadata (a tagged release) and
    # the tree state; helm 4 takes the Kubernetes version it reports when no cluster is asked
    # from the client-go module it was built with.
    local helm hv ldflags
    helm=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
    hv=helm.sh/helm/v4
    ldflags="-s -w -X $hv/internal/version.version=$helm -X $hv/internal/version.metadata="
    ldflags+=" -X $hv/internal/version.gitTreeState=clean"
    echo "control-plane.sh: building helm $helm" >&2
    CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$into/" "$hv/cmd/helm"
    cd - >/dev/null
}

cached_build control-plane.sh control-plane "$control_plane_inputs" "$out" build_control_plane
cached_build control-plane.sh helm "$helm_inputs" "$out" build_helm
echo "$inputs" > "$stamp"
