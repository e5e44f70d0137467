#!/usr/bin/env python3
"""Prints `--test NAME` for every test target of a workspace package, but those named after it.

`make unit` runs the chaos suite in a lane of its own beside the other suites. The other lane
names the package's remaining suites here, from `cargo metadata`, so that a suite added to the
package's Cargo.toml runs without a Makefile change.

Usage: cargo metadata --no-deps --format-version 1 | test_targets.py PACKAGE [EXCLUDED...]
"""

import json
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    package, excluded = sys.argv[1], set(sys.argv[2:])
    metadata = json.load(sys.stdin)
    found = [p for p in metadata["packages"] if p["name"] == package]
    if not found:
        print(f"test_targets.py: no package {package!r} in the workspace", file=sys.stderr)
        return 1
    names = sorted(
        t["name"]
        for t in found[0]["targets"]
        if "test" in t["kind"] and t["name"] not in excluded
    )
    unknown = excluded - {t["name"] for t in found[0]["targets"]}
    if unknown:
        print(f"test_targets.py: {package} has no target {sorted(unknown)}", file=sys.stderr)
        return 1
    print(" ".join(f"--test {name}" for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
