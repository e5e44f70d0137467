#!/usr/bin/env python3
"""Fails when the modules of a crate of the workspace import each other in a cycle.

Each `.rs` file under a crate's `src/` is a module (`fleet/argocd.rs` is `fleet::argocd`); in a
package of test targets alone (e2e/tests: the suites and their `support` module), under the
package's directory. A module depends on the modules its non-test code names through `crate::…`
or `super::…`, inline or in a `use` tree (`use crate::{a, b::{c, d}}`). A cycle such as
`cli -> fleet::installation -> fleet::argocd -> cli` means no module of it can be understood, or
moved to a crate of its own, without the others. Test modules (after `#[cfg(test)]`) are left
out: a test may reach anywhere. Run by `make test` (`make cycles`); prints every cycle found.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent for p in ROOT.glob("*/*/Cargo.toml"))
# Where each package's modules are: src/, or the package's own directory when it has only
# test targets.
CRATES = [p / "src" if (p / "src").is_dir() else p for p in PACKAGES]


def module_of(src: Path, file: Path) -> str:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return "::".join(parts)


def resolve(src: Path, parts: list[str]) -> str | None:
    """The longest prefix of `parts` that is a module file of `src`."""
    for n in range(len(parts), 0, -1):
        path = src.joinpath(*parts[:n])
        if path.with_suffix(".rs").exists() or (path / "mod.rs").exists():
            return "::".join(parts[:n])
    return None


def use_paths(tree: str, prefix: str = "") -> list[str]:
    """The paths a `use` tree names: `crate::{a::b, c::{d, e}}` gives `crate::a::b`,
    `crate::c::d` and `crate::c::e`."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        return [prefix + tree.split(" as ")[0].strip()]
    head, body = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [path for part in parts if part.strip() for path in use_paths(part, prefix + head)]


def named_paths(code: str) -> list[str]:
    """The paths the code names: those of its `use` trees, and every `crate::…` or
    `super::…` written inline."""
    paths = [p for tree in re.findall(r"\buse\s+([^;]+);", code) for p in use_paths(tree)]
    paths += re.findall(r"\b(?:crate|super)::(?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*", code)
    return paths


def edges(src: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for file in sorted(src.rglob("*.rs")):
        module = module_of(src, file)
        code = file.read_text().split("#[cfg(test)]")[0]
        # Comments may name modules (doc links) without importing them.
        code = re.sub(r"//[^\n]*", "", code)
        deps: set[str] = set()
        paths = named_paths(code)
        for path in (p.removeprefix("crate::") for p in paths if p.startswith("crate::")):
            target = resolve(src, path.split("::"))
            if target:
                deps.add(target)
        parent = module.rsplit("::", 1)[0].split("::") if "::" in module else []
        for path in (p.removeprefix("super::") for p in paths if p.startswith("super::")):
            target = resolve(src, parent + path.split("::")) if parent else None
            if target:
                deps.add(target)
        graph[module] = deps - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle, each once, starting at its smallest module."""
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for next_node in sorted(graph.get(node, ())):
            if next_node == start:
                found.add(tuple(path))
            elif next_node > start and next_node not in path:
                walk(start, next_node, path + [next_node])

    for start in sorted(graph):
        walk(start, start, [start])
    return [list(c) for c in sorted(found)]


def main() -> int:
    failed = 0
    for src in CRATES:
        graph = edges(src)
        found = cycles(graph)
        name = (src.parent if src.name == "src" else src).relative_to(ROOT)
        if found:
            failed += 1
            print(f"FAILED {name}: {len(found)} import cycle(s) among its modules")
            for cycle in found:
                print("  " + " -> ".join(cycle + [cycle[0]]))
        else:
            edges_count = sum(len(d) for d in graph.values())
            print(f"ok     {name}: {len(graph)} modules, {edges_count} imports, no cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
