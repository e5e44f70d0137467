"""What every check shares: the repository's paths, the list of failures, rendering a release
with Helm's engine, and the small helpers that read its objects and validate them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "charts" / "shardwise"
KIND_SCRIPT = ROOT / "e2e" / "kind" / "run.sh"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ["1.25.0", "1.37.0"]
# Kinds of the Prometheus operator, for which kubernetes-validate has no schema: checked by the
# assertions of the checks instead (port, selector, namespace).
OPERATOR_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


class Failures:
    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, condition: bool, message: str) -> bool:
        if not condition:
            self.items.append(message)
        return condition


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def render_with_notes(
    chart: helm.Chart, values: dict[str, Any] | None, release: str, namespace: str
) -> tuple[list[dict[str, Any]], str]:
    """The release's objects, and its NOTES.txt."""
    manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects, notes = [], ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
        elif not path.endswith(".txt"):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects, notes


def render(
    chart: helm.Chart, values: dict[str, Any] | None, release: str, namespace: str
) -> list[dict[str, Any]]:
    return render_with_notes(chart, values, release, namespace)[0]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind}, found {len(found)}")
    return found[0]


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h)", duration))


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def validate(f: Failures, objects: list[dict[str, Any]], where: str) -> int:
    """Strict validation against each Kubernetes version's schemas; returns objects checked."""
    checked = 0
    for o in objects:
        if (o["apiVersion"], o["kind"]) in OPERATOR_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                f.check(
                    False,
                    f"{where}: {o['kind']}/{o['metadata']['name']} invalid for Kubernetes {version}: {path}: {e.message}",
                )
            except kubernetes_validate.SchemaNotFoundError as e:
                f.check(False, f"{where}: {e.message}")
        checked += 1
    return checked
