# Common tasks. `make test` is what CI runs (.ci/run).

CARGO ?= cargo
PYTHON ?= python3
DOCKER ?= docker
IMAGE ?= shardwise:dev

.PHONY: all build test prerequisites control-plane argocd fmt fmt-check clippy features doc config-table-check cycles package machete deny test-build unit bench bench-assign bench-fleet bench-apiserver bench-planner bench-scale bench-argocd simulate demo crds clean clean-cache config-table

all: build

build:
	$(CARGO) build --workspace --release

## The reference rebalancing experiment: 100 clusters, 10,000 apps, 10 -> 9 shards, 100 seeds.
simulate:
	$(CARGO) run --release --quiet -p shardwise-cli --bin shardwise -- simulate

## The controller itself, with no Kubernetes: an embedded control plane and two destination
## clusters (the in-memory test API server), a fleet of 20 clusters and 1,000 apps, 3 real
## replicas scaled 3 -> 4 -> 2 and one killed, shown live, then a checked summary. Nothing is
## left running. `make demo ARGS=--keep` leaves the fleet up for kubectl until Ctrl-C;
## `make demo ARGS=--real` runs it on a real cluster of local processes (kube-apiserver, etcd,
## kube-controller-manager, kube-scheduler and a node agent, built and installed first by
## scripts/prerequisites.sh), with the chart installed by Helm.
demo:
	$(if $(findstring --real,$(ARGS)),scripts/prerequisites.sh)
	$(CARGO) build -p shardwise-controller -p shardwise-demo
	$(CARGO) run --quiet -p shardwise-demo -- $(ARGS)

## Everything CI checks: formatting, lints (warnings are errors), the API docs, no import cycle, the Helm chart, and every test
## (the dashboard's against a real Prometheus), all with the committed lockfile (`--locked`, as
## the image's build stage uses it). The image's release build is not part of it: the tests
## compile and link the same code, and a release compile alone would take a tenth of CI's budget
## (`make image-check` runs it). Installs what is missing first (scripts/prerequisites.sh), so it
## works on a fresh machine.
##
## The checks that read the controller's and the balancer's --help (the configuration table,
## the chart's settings) run after the workspace's test build and take both binaries from it
## (SHARDWISE_BINARIES): on their own they would compile both packages again with the features
## each resolves alone, about five minutes of a fresh machine's CI.
test: export SHARDWISE_BINARIES = $(CURDIR)/target/debug
test: prerequisites fmt-check clippy features doc cycles package test-build config-table-check chart unit machete deny

prerequisites:
	scripts/prerequisites.sh

## The control plane the tests and the demo run on (kube-apiserver, kube-controller-manager,
## kube-scheduler, etcd) and helm, from the Go modules pinned in e2e/control-plane and e2e/helm,
## into target/control-plane/; nothing to do when it is up to date.
control-plane:
	scripts/control-plane.sh

## Argo CD's application controller and repo server, the ground truth of the Argo CD suite
## (e2e/argocd-suite), from the module pinned in e2e/argocd, into target/argocd/ with the
## release's CRDs and the controller's ClusterRole; nothing to do when it is up to date, and
## waits for a build under way.
argocd:
	scripts/argocd.sh

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --all-features --locked -- -D warnings

## The runtime as a library: without its default features it builds (clippy, no warnings) and
## links no clap, HTTP server, TLS stack, procfs or tracing-subscriber; shardwise-plan links no
## HTTP server or procfs (scripts/features.sh).
features:
	CARGO="$(CARGO)" scripts/features.sh

## The API docs of every crate, with rustdoc's warnings (broken links included) as errors;
## every library crate denies missing docs.
doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --locked

## docs/architecture.md's configuration table is what `shardwise-controller --help` gives.
config-table-check:
	CARGO="$(CARGO)" $(PYTHON) scripts/config_table.py --check

## Regenerate docs/architecture.md's configuration table from `shardwise-controller --help`.
config-table:
	CARGO="$(CARGO)" $(PYTHON) scripts/config_table.py

## No crate's modules import each other in a cycle (scripts/module_cycles.py lists them).
cycles:
	$(PYTHON) scripts/module_cycles.py

## The library crates as crates.io would take them (metadata, versions beside path
## dependencies, READMEs), unpublished. Without --no-verify each is also built alone from its
## package (about 4 minutes on 2 cores; docs/releasing.md).
LIBRARY_CRATES = shard-assign shardwise-sim shardwise-handoff shardwise-scale shardwise-wire shardwise-api shardwise-runtime shardwise-plan
package:
	$(CARGO) package --no-verify --allow-dirty --locked $(addprefix -p ,$(LIBRARY_CRATES))

## No crate declares a dependency it does not use (cargo-machete; what it cannot see, a
## derive's generated paths or a module included by path, is listed in the crate's
## [package.metadata.cargo-machete] with the reason).
machete:
	scripts/cargo-tools.sh
	$(CARGO) machete

## Every dependency under an allowed license, from crates.io, in one version but for the
## listed exceptions (cargo-deny, deny.toml). Not its advisories: their database is on GitHub,
## which CI cannot reach.
deny:
	scripts/cargo-tools.sh
	$(CARGO) deny --offline check bans licenses sources

## Every test once: unit tests, and the end-to-end suites on kube-apiserver and etcd (each
## suite prints the kube-apiserver version it ran on). Argo CD's suite (its own package) runs
## last, once Argo CD is built (`make argocd` waits for the build prerequisites.sh started); a
## failure before it still fails the target. (Beside the others it would end CI some ten
## minutes sooner, but the load made e2e_chaos and the demo's test fail in a trial: docs/testing.md.)
unit: control-plane test-build
	$(CARGO) test --workspace --exclude shardwise-e2e-argocd --locked --no-fail-fast; status=$$?; \
	$(MAKE) --no-print-directory argocd && \
	$(CARGO) test -p shardwise-e2e-argocd --locked --no-fail-fast && exit $$status

## Compiles every test of `make unit` (and the binaries they run) without running one.
test-build:
	$(CARGO) test --workspace --exclude shardwise-e2e-argocd --locked --no-run

## Benchmarks with their targets; figures go to docs/benchmarks.md.
bench: bench-assign bench-apiserver bench-planner bench-fleet bench-scale bench-argocd

bench-assign:
	$(CARGO) bench -p shard-assign --bench assign
	$(CARGO) build --release -p shardwise-cli
	python3 scripts/bench_report.py

## The test API server: LIST of 10,000 objects, writes per second with 10 watchers.
bench-apiserver:
	$(CARGO) bench -p shardwise-test-apiserver

## The planner at 200,000 apps: its index and one pass, no processes (targets: < 1 s, < 1 GiB).
bench-planner:
	$(CARGO) bench -p shardwise-runtime --features bench --bench planner

## Controller fleets: throughput scaling, memory per shard, handoff times, the chart on a real
## StatefulSet controller beside the harness playing it, measured load against counted apps,
## moves and cache copies. Builds the control plane first.
bench-fleet: control-plane
	$(CARGO) bench -p shardwise-e2e-suites --bench fleet

## Argo CD's largest published test, 50,000 apps on 500 clusters at 3, 6, 9 and 12 replicas
## (longer than the rest of bench-fleet together), on kube-apiserver and etcd, with what each
## app synced costs the control plane. ARGS="--apps=5000 --replicas=3,6" runs a smaller one.
bench-scale: control-plane
	$(CARGO) bench -p shardwise-e2e-suites --bench fleet -- scale $(ARGS)

## The Argo CD balancer (a real `shardwise-balancer`) against Argo CD's algorithms: one fleet of
## 100 clusters and 10,000 apps through adoption, clusters joining and leaving, a hot spot and
## 10 -> 9 -> 10 replicas, Argo CD's placement computed; then Argo CD's own controllers (4) under
## its three algorithms and under the balancer, measured side by side.
bench-argocd: control-plane argocd
	$(CARGO) bench -p shardwise-balancer --bench argocd_balancer
	$(CARGO) bench -p shardwise-e2e-argocd --bench argocd

## Regenerate deploy/crds.yaml (and the chart's copy) from the Rust types (tests fail when stale).
crds:
	$(CARGO) run --quiet -p shardwise-cli --bin shardwise -- crds > deploy/crds.yaml
	cp deploy/crds.yaml charts/shardwise/crds/crds.yaml

.PHONY: chart chart-crds chart-readme image-binaries image-check image e2e-kind dashboard-picture

## Lint, render and validate the Helm chart with Helm's engine (scripts/requirements.txt), and
## type-check the dashboard against Grafana's published schema (scripts/dashboard-schema).
chart:
	CARGO="$(CARGO)" $(PYTHON) scripts/chart.py
	node scripts/dashboard-schema/check.mjs

## Regenerate the chart's README from the `# --` comments of values.yaml (`make chart` fails
## while it is stale).
chart-readme:
	$(PYTHON) scripts/chart_readme.py

## Copy the CRDs into the chart after `make crds` (`make chart` fails while they differ).
chart-crds:
	cp deploy/crds.yaml charts/shardwise/crds/crds.yaml

## The Dockerfile's build stage: both binaries, release, with the committed Cargo.lock.
image-binaries:
	$(CARGO) build --release --locked -p shardwise-controller -p shardwise-cli -p shardwise-balancer

## The same, compiled without code generation or linking.
image-check:
	$(CARGO) check --release --locked -p shardwise-controller -p shardwise-cli -p shardwise-balancer

## The container image (needs a Docker engine).
image:
	$(DOCKER) build -t $(IMAGE) .

## The chart on a real cluster: kind, the image, the chart, fleets, scaling (docs/operations.md).
e2e-kind:
	e2e/kind/run.sh

## docs/dashboard.png from real data: the series of the dashboard test's Prometheus, drawn by
## scripts/dashboard_picture.py (pip install -r scripts/requirements-picture.txt).
dashboard-picture:
	data=$$(mktemp) \
	&& SHARDWISE_DASHBOARD_DATA=$$data $(CARGO) test -p shardwise-e2e-suites --test e2e_dashboard \
	&& $(PYTHON) scripts/dashboard_picture.py $$data docs/dashboard.png \
	&& rm -f $$data

clean:
	$(CARGO) clean

## Removes the per-user cache of built real components (kube-apiserver and its peers, etcd,
## helm, Argo CD) and of compiled crates, which every clone on this machine shares: the next
## build makes them again.
clean-cache:
	bash -c '. scripts/lib/rust-cache.sh && use_rust_cache && { sccache --stop-server >/dev/null 2>&1 || true; } && dir=$$(shardwise_cache) && chmod -R u+w "$$dir" 2>/dev/null; rm -rf "$$dir" && echo "removed $$dir"'
