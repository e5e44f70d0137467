#!/usr/bin/env python3
"""Summarise the shard-assignment benchmarks against their targets.

Reads criterion's estimates (target/criterion/<group>/<id>/new/estimates.json), times
`shardwise simulate` (the default scenario) end to end, prints a Markdown table for
docs/benchmarks.md and exits 1 if a target is missed.
"""

import json
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRITERION = ROOT / "target" / "criterion"
STRATEGIES = [
    "legacy-modulo",
    "round-robin",
    "greedy-minimum",
    "weighted-ring-hash",
    "bounded-load",
    "sticky-balanced",
    "sticky-balanced-with-previous",
]
TARGET_10K_MS = 50.0
TARGET_REFERENCE_MS = 1.0
TARGET_GROWTH = 15.0
TARGET_SIMULATE_S = 10.0


def median_ms(group: str, bench: str) -> float:
    path = CRITERION / group / bench / "new" / "estimates.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        sys.exit(f"bench_report: no estimate at {path}; run `cargo bench -p shard-assign` first")
    return data["median"]["point_estimate"] / 1e6


def time_simulate(runs: int = 3) -> float:
    binary = ROOT / "target" / "release" / "shardwise"
    durations = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([str(binary), "simulate", "--format", "json"], check=True,
                       stdout=subprocess.DEVNULL)
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def main() -> int:
    failures = []
    print("| strategy | reference (100 clusters, 10 shards) | 1,000 clusters | 10,000 clusters, 1M apps, 100 shards | growth 1k -> 10k |")
    print("|---|---:|---:|---:|---:|")
    for strategy in STRATEGIES:
        ref = median_ms("reference", strategy)
        small = median_ms("1k-clusters", strategy)
        large = median_ms("10k-clusters", strategy)
        growth = large / small
        print(f"| {strategy} | {ref * 1000:.1f} µs | {small:.3f} ms | {large:.2f} ms | {growth:.1f}x |")
        if ref > TARGET_REFERENCE_MS:
            failures.append(f"{strategy}: reference scenario {ref:.3f} ms > {TARGET_REFERENCE_MS} ms")
        if large > TARGET_10K_MS:
            failures.append(f"{strategy}: 10k clusters {large:.1f} ms > {TARGET_10K_MS} ms")
        if growth > TARGET_GROWTH:
            failures.append(f"{strategy}: growth {growth:.1f}x > {TARGET_GROWTH}x")
    simulate = time_simulate()
    print()
    print(f"`shardwise simulate` (reference scenario, 100 seeds, 6 strategies): {simulate:.2f} s wall time (median of 3)")
    if simulate > TARGET_SIMULATE_S:
        failures.append(f"simulate took {simulate:.1f} s > {TARGET_SIMULATE_S} s")
    for failure in failures:
        print(f"TARGET MISSED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
