#!/usr/bin/env python3
"""Writes charts/shardwise/README.md from Chart.yaml and the `# --` comments of values.yaml, the
convention of helm-docs (which is not needed: this script is the generator).

A comment block right above a key documents it when its first line starts with `# --`; the lines
after it continue the description. `# -- (int) text` names the type when the default cannot
(null), and a last line `# @default -- text` replaces the default shown. Each documented key is
one row: its dotted path, type, default (as JSON) and description. Keys under a documented key
are part of its default; `undocumented()` lists every value without a description, so that
scripts/chart.py can refuse them.

Usage: python3 scripts/chart_readme.py          (rewrites the README)
       python3 scripts/chart_readme.py --check  (exits 1 when the README is stale)
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
HELM_MODULE = ROOT / "e2e" / "helm" / "go.mod"
CHART = ROOT / "charts" / "shardwise"
README = CHART / "README.md"
REGENERATE = "python3 scripts/chart_readme.py"

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?:\s|$)")
COMMENT = re.compile(r"^ *#(?: (?P<text>.*))?$")
TYPED = re.compile(r"^\((?P<type>[a-z]+)\) (?P<text>.*)$")
DEFAULT = re.compile(r"^@default -- (?P<text>.*)$")


@dataclass
class Row:
    key: str
    type: str
    default: str
    description: str


class ValuesError(Exception):
    pass



def helm_tested() -> str:
    """The helm version the suites run: helm.sh/helm/v4's in e2e/helm/go.mod."""
    found = re.search(r"^\s*helm\.sh/helm/v4 (v\S+)", HELM_MODULE.read_text(), re.MULTILINE)
    if not found:
        sys.exit(f"{HELM_MODULE}: no helm.sh/helm/v4 requirement")
    return found.group(1)

def documented_keys(text: str) -> dict[str, tuple[str, str | None, str | None]]:
    """Dotted key -> (description, type override, default override), from the `# --` comments."""
    found: dict[str, tuple[str, str | None, str | None]] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        comment = COMMENT.match(line)
        if comment:
            block.append(comment.group("text") or "")
            continue
        key = KEY.match(line)
        if not key:
            # A blank line or a list item ends the comment block: it documents nothing.
            block = []
            continue
        indent = len(key.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key.group("key")])
        stack.append((indent, key.group("key")))
        start = next((i for i, b in enumerate(block) if b.startswith("-- ") or b == "--"), None)
        if start is not None:
            lines = [block[start][3:]] + block[start + 1 :]
            override = DEFAULT.match(lines[-1])
            default = override.group("text") if override else None
            if override:
                lines = lines[:-1]
            description = " ".join(line.strip() for line in lines).strip()
            typed = TYPED.match(description)
            kind = typed.group("type") if typed else None
            if typed:
                description = typed.group("text")
            if not description:
                raise ValuesError(f"values.yaml:{number}: `# --` without a description for {path}")
            found[path] = (description, kind, default)
        block = []
    return found


def lookup(values: Any, path: str) -> Any:
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValuesError(f"values.yaml: documented key {path} is not a value")
        node = node[part]
    return node


def type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "string"


def cell(text: str) -> str:
    """Markdown table cell: pipes escaped, so that defaults with `|` keep the table intact."""
    return text.replace("|", "\\|")


def rows(values_text: str) -> list[Row]:
    values = yaml.safe_load(values_text)
    out = []
    for path, (description, kind, default) in documented_keys(values_text).items():
        value = lookup(values, path)
        shown = default if default is not None else f"`{json.dumps(value, separators=(',', ':'))}`"
        out.append(Row(path, kind or type_of(value), shown, description))
    return out


def undocumented(values_text: str) -> list[str]:
    """Values that neither have a description nor sit under a key that has one."""
    documented = set(documented_keys(values_text))
    missing = []

    def walk(node: Any, path: str) -> None:
        if path in documented:
            return
        if isinstance(node, dict) and node:
            for key, child in node.items():
                walk(child, f"{path}.{key}" if path else key)
        else:
            missing.append(path)

    walk(yaml.safe_load(values_text), "")
    return missing


def render() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values_text = (CHART / "values.yaml").read_text()
    table = "\n".join(
        f"| {cell(r.key)} | {r.type} | {cell(r.default)} | {cell(r.description)} |" for r in rows(values_text)
    )
    description = " ".join(chart["description"].split())
    version, app_version = (chart[k].replace("-", "--") for k in ("version", "appVersion"))
    return f"""<!-- Generated from Chart.yaml and values.yaml by {REGENERATE}; do not edit. -->
# {chart["name"]}

![Version: {chart["version"]}](https://img.shields.io/badge/Version-{version}-informational)
![Type: {chart["type"]}](https://img.shields.io/badge/Type-{chart["type"]}-informational)
![AppVersion: {chart["appVersion"]}](https://img.shields.io/badge/AppVersion-{app_version}-informational)

{description}

**Homepage:** <{chart["home"]}>

## Install

Kubernetes `{chart["kubeVersion"]}`, Helm 4. The project's suites install, upgrade, test and
uninstall the chart with helm {helm_tested()}, built from `e2e/helm`; Helm 3 is past its
security support and is not tested.

```sh
helm install shardwise charts/shardwise --namespace shardwise --create-namespace
helm test shardwise --namespace shardwise
```

One release per namespace. Installing, upgrading (the CRDs too, with `crds.upgrade`), scaling,
monitoring (`metrics.*`, `prometheusRule.*`, `dashboards.*`) and the values of argo-helm's
`controller.*` that these correspond to are in the
[operations guide]({chart["home"]}/blob/main/docs/operations.md).

## Values

| Key | Type | Default | Description |
|-----|------|---------|-------------|
{table}
"""


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if README.read_text() != text:
            print(f"{README.relative_to(ROOT)} is stale: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
