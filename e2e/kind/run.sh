#!/usr/bin/env bash
# `make e2e-kind`: the chart on a real cluster, end to end. Creates a kind cluster, builds the
# image and loads it into the cluster, installs the chart, creates a fleet whose destination is
# the kind cluster itself (through a token with just the rights the apps need), and checks that:
# every cluster is Connected and every app Synced, each by a shard of its own; no request of the
# controller was refused (least-privilege RBAC; read from the metrics over https with a scraper
# token, which an anonymous request does not get); a pin moves its cluster; `kubectl scale
# statefulset` down and up moves the work to the shards that exist; a rolling restart hands every
# shard over and back. The cluster is deleted at the end, also on failure.
#
# Needs: a Docker engine, docker, kind (0.20 or later), kubectl, helm (3.10 or later), curl.
# Settings (environment): KIND_CLUSTER (shardwise-e2e), IMAGE (shardwise:e2e), KIND_NODE_IMAGE
# (a kindest/node image, for another Kubernetes version), KEEP_CLUSTER=1 to keep the cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER:-shardwise-e2e}
IMAGE=${IMAGE:-shardwise:e2e}
NAMESPACE=shardwise
RELEASE=shardwise
STATEFULSET=shardwise
CLUSTERS=8
APPS_PER_CLUSTER=3
TIMEOUT=300

for tool in docker kind kubectl helm curl; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "e2e-kind: $tool is required (docs/operations.md, 'Testing on kind')" >&2
        exit 2
    fi
done

# A kubeconfig of its own: the user's current context is left alone.
KUBECONFIG=$(mktemp)
export KUBECONFIG

teardown() {
    local status=$?
    if ((status != 0)); then
        echo "e2e-kind: FAILED; the state of the release:" >&2
        kubectl -n "$NAMESPACE" get pods,leases,fleetclusters,fleetapps -o wide >&2 || true
        kubectl -n "$NAMESPACE" logs -l "app.kubernetes.io/instance=$RELEASE" --prefix --tail=40 >&2 || true
    fi
    if [[ ${KEEP_CLUSTER:-0} == 1 ]]; then
        echo "e2e-kind: kept cluster $CLUSTER (kubeconfig $KUBECONFIG; kind delete cluster --name $CLUSTER)"
    else
        kind delete cluster --name "$CLUSTER" || true
        rm -f "$KUBECONFIG"
    fi
    exit "$status"
}
trap teardown EXIT

step() { printf '\n=== %s\n' "$*"; }

# Runs a check until it succeeds; fails with its last output after `timeout` seconds.
wait_until() {
    local what=$1 timeout=$2 out
    shift 2
    local deadline=$((SECONDS + timeout))
    until out=$("$@" 2>&1); do
        if ((SECONDS >= deadline)); then
            echo "e2e-kind: timed out after ${timeout}s waiting for $what: $out" >&2
            return 1
        fi
        sleep 3
    done
    echo "ok: $what"
}

k() { kubectl -n "$NAMESPACE" "$@"; }

# Every cluster Connected on a live shard (its label matching the regex $1) and not draining;
# every app Synced at its generation, on its cluster's shard, its status written by that shard.
settled() {
    local live=$1 clusters apps bad
    clusters=$(k get fleetclusters -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.labels.shardwise\.io/shard}{" "}{.status.phase}{" "}{.metadata.annotations.shardwise\.io/drain-to}{"\n"}{end}')
    apps=$(k get fleetapps -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.destination.cluster}{" "}{.metadata.labels.shardwise\.io/shard}{" "}{.status.shard}{" "}{.status.syncPhase}{" "}{.status.observedGeneration}{" "}{.metadata.generation}{"\n"}{end}')
    bad=$(awk -v live="$live" '$2 !~ live || $3 != "Connected" || NF > 3' <<<"$clusters")
    if [[ -n $bad ]]; then
        echo "clusters not settled (name shard phase drain-to): $bad"
        return 1
    fi
    bad=$(awk 'NR == FNR { shard[$1] = $2; next }
               $3 != shard[$2] || $4 != $3 || $5 != "Synced" || $6 != $7' \
        <(echo "$clusters") <(echo "$apps"))
    if [[ -n $bad ]]; then
        echo "apps not settled (name cluster shard status-shard phase observed generation): $bad"
        return 1
    fi
    echo "$(wc -l <<<"$clusters") clusters, $(wc -l <<<"$apps") apps"
}

# The shards that own at least one cluster, e.g. "0 1 2".
owning_shards() {
    k get fleetclusters -o jsonpath='{range .items[*]}{.metadata.labels.shardwise\.io/shard}{"\n"}{end}' \
        | sort -un | tr '\n' ' '
}

cluster_on() {
    local shard
    shard=$(k get fleetcluster "$1" -o jsonpath='{.metadata.labels.shardwise\.io/shard}')
    [[ $shard == "$2" ]] || { echo "$1 is on shard $shard"; return 1; }
}

# The token controller has filled in the Secret's token.
token_issued() { [[ -n $(k get secret "$1" -o jsonpath='{.data.token}') ]] || { echo "no token in $1 yet"; return 1; }; }

has_shard() { [[ " $(owning_shards) " == *" $1 "* ]] || { echo "shards owning clusters: $(owning_shards)"; return 1; }; }

# GET /metrics of pod $1 over a port-forward with bearer token $2 (empty: none); prints the body
# and fails on any answer but 200. The metrics are secure: https, a self-signed certificate.
scrape() {
    local pod=$1 token=$2 forward status
    k port-forward "$pod" 18080:8080 >/dev/null 2>&1 &
    forward=$!
    sleep 2
    status=0
    curl -sfk ${token:+-H "Authorization: Bearer $token"} https://127.0.0.1:18080/metrics || status=$?
    kill "$forward" 2>/dev/null || true
    wait "$forward" 2>/dev/null || true
    return "$status"
}

# No request of any replica refused by RBAC, from each replica's /metrics, read as the scraper
# account bound to the metrics-reader role; without a token the metrics are refused.
no_forbidden() {
    local pod metrics token
    token=$(k create token scraper --duration=10m)
    for pod in $(k get pods -l "app.kubernetes.io/instance=$RELEASE" -o name); do
        if scrape "$pod" "" >/dev/null; then
            echo "$pod served its metrics without a token"
            return 1
        fi
        metrics=$(scrape "$pod" "$token")
        if grep -E '^shardwise_api_requests_total\{.*code="403"' <<<"$metrics"; then
            return 1
        fi
    done
}

step "kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 180s \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}

step "image $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "chart"
helm install "$RELEASE" charts/shardwise --namespace "$NAMESPACE" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set controller.resyncInterval=20s --set controller.probeInterval=20s \
    --set controller.planInterval=10s --set controller.logFormat=text \
    --set-json "metrics.readers=[{\"kind\":\"ServiceAccount\",\"name\":\"scraper\",\"namespace\":\"$NAMESPACE\"}]" \
    --wait --timeout "${TIMEOUT}s"
k get statefulset,pods,leases

step "helm test: every replica ready"
helm test "$RELEASE" --namespace "$NAMESPACE" --logs --timeout "${TIMEOUT}s"

k create serviceaccount scraper

step "destination: the kind cluster itself, through a token of its own"
k apply -f - <<YAML
apiVersion: v1
kind: ServiceAccount
metadata:
  name: destination
---
apiVersion: v1
kind: Secret
metadata:
  name: destination-token
  labels:
    shardwise.io/secret-type: cluster
  annotations:
    kubernetes.io/service-account.name: destination
type: kubernetes.io/service-account-token
stringData:
  server: https://kubernetes.default.svc
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: shardwise-e2e-destination
rules:
  - apiGroups: [""]
    resources: ["namespaces"]
    verbs: ["get", "create", "patch"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: shardwise-e2e-destination
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: shardwise-e2e-destination
subjects:
  - kind: ServiceAccount
    name: destination
    namespace: $NAMESPACE
YAML
wait_until "the destination token" 60 token_issued destination-token

step "fleet: $CLUSTERS clusters, $((CLUSTERS * APPS_PER_CLUSTER)) apps"
{
    for ((c = 0; c < CLUSTERS; c++)); do
        cat <<YAML
---
apiVersion: shardwise.io/v1alpha1
kind: FleetCluster
metadata:
  name: cluster-$c
spec:
  server: https://kubernetes.default.svc
  credentials:
    secretRef:
      name: destination-token
YAML
        for ((a = 0; a < APPS_PER_CLUSTER; a++)); do
            cat <<YAML
---
apiVersion: shardwise.io/v1alpha1
kind: FleetApp
metadata:
  name: app-$c-$a
spec:
  destination:
    cluster: cluster-$c
    namespace: e2e-team-$a
  source:
    manifests: |
      apiVersion: v1
      kind: ConfigMap
      metadata:
        name: app-$c-$a
      data:
        cluster: cluster-$c
YAML
        done
    done
} | k apply -f -

k wait fleetclusters --all --for=jsonpath='{.status.phase}'=Connected --timeout="${TIMEOUT}s"
k wait fleetapps --all --for=condition=Synced --timeout="${TIMEOUT}s"
wait_until "every app Synced by its cluster's shard" "$TIMEOUT" settled '^[012]$'
wait_until "work on every shard" "$TIMEOUT" has_shard 2
applied=$(kubectl get configmaps -A -l app.kubernetes.io/managed-by=shardwise --no-headers | wc -l)
if ((applied != CLUSTERS * APPS_PER_CLUSTER)); then
    echo "e2e-kind: $applied ConfigMaps applied, expected $((CLUSTERS * APPS_PER_CLUSTER))" >&2
    exit 1
fi
echo "ok: $applied objects applied in the destination"
wait_until "no request refused by RBAC" 10 no_forbidden

step "pin cluster-0 to shard 2"
k patch fleetcluster cluster-0 --type merge -p '{"spec":{"shard":2}}'
wait_until "cluster-0 on shard 2" "$TIMEOUT" cluster_on cluster-0 2
k wait fleetcluster cluster-0 --for=condition=PinHonoured --timeout="${TIMEOUT}s"
wait_until "the fleet settled" "$TIMEOUT" settled '^[012]$'

step "scale down to 2 replicas"
k scale statefulset "$STATEFULSET" --replicas=2
wait_until "shard 2's work on shards 0 and 1" "$TIMEOUT" settled '^[01]$'
k wait fleetcluster cluster-0 --for=condition=PinHonoured=False --timeout="${TIMEOUT}s"

step "scale up to 4 replicas"
k scale statefulset "$STATEFULSET" --replicas=4
k rollout status statefulset "$STATEFULSET" --timeout="${TIMEOUT}s"
wait_until "shard 3 owning clusters" "$TIMEOUT" has_shard 3
wait_until "cluster-0 back on its pinned shard" "$TIMEOUT" cluster_on cluster-0 2
k wait fleetcluster cluster-0 --for=condition=PinHonoured --timeout="${TIMEOUT}s"
wait_until "the fleet settled on 4 shards" "$TIMEOUT" settled '^[0-3]$'

step "rolling restart"
k rollout restart statefulset "$STATEFULSET"
k rollout status statefulset "$STATEFULSET" --timeout="${TIMEOUT}s"
wait_until "the fleet settled after the restart" "$TIMEOUT" settled '^[0-3]$'
wait_until "no request refused by RBAC" 10 no_forbidden

step "helm test after the restart"
helm test "$RELEASE" --namespace "$NAMESPACE" --logs --timeout "${TIMEOUT}s"

step "e2e-kind passed"
k get fleetclusters
