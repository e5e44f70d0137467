# Common tasks. `make test` is what CI runs (.ci/run).

CARGO ?= cargo

.PHONY: all build test fmt fmt-check clippy unit bench bench-assign bench-fleet simulate crds clean

all: build

build:
	$(CARGO) build --workspace --release

## The reference rebalancing experiment: 100 clusters, 10,000 apps, 10 -> 9 shards, 100 seeds.
simulate:
	$(CARGO) run --release --quiet -p shardwise-cli --bin shardwise -- simulate

## Everything CI checks: formatting, lints (warnings are errors), every test.
test: fmt-check clippy unit

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace

## Benchmarks with their targets; figures go to docs/benchmarks.md.
bench: bench-assign bench-fleet

bench-assign:
	$(CARGO) bench -p shard-assign --bench assign
	$(CARGO) build --release -p shardwise-cli
	python3 scripts/bench_report.py

## Controller fleets on the test API server: throughput scaling, memory per shard, handoff times.
bench-fleet:
	$(CARGO) bench -p shardwise-controller --bench fleet

## Regenerate deploy/crds.yaml from the Rust types (a test fails when it is stale).
crds:
	$(CARGO) run --quiet -p shardwise-cli --bin shardwise -- crds > deploy/crds.yaml

clean:
	$(CARGO) clean
