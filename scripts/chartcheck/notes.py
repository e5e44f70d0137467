"""NOTES.txt: it names what the release rendered, by its real names, and says who sets the
replica count."""

from __future__ import annotations

import json
from typing import Any

from .balancer import is_balancer
from .common import Failures, one, seconds


def check_notes(f: Failures, notes: str, objects: list[dict[str, Any]], values: dict[str, Any], where: str) -> None:
    """NOTES.txt names what was rendered, by its real names, and every layout of cluster Secret, and
    says who sets the replica count."""
    rules = [o["metadata"]["name"] for o in objects if o["kind"] == "PrometheusRule"]
    f.check(
        ("PrometheusRule " in notes) == bool(rules) and all(f"PrometheusRule {n}" in notes for n in rules),
        f"{where}: NOTES.txt and the PrometheusRules rendered ({rules}) disagree",
    )
    titles = [
        json.loads(o["data"]["shardwise.json"])["title"]
        for o in objects
        if o["kind"] == "ConfigMap" and "shardwise.json" in o["data"]
    ]
    f.check(
        ("Grafana dashboard" in notes) == bool(titles) and all(f'"{t}"' in notes for t in titles),
        f"{where}: NOTES.txt does not name the dashboard by its title {titles}",
    )
    statefulsets = [o["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet"]
    f.check(
        ("StatefulSet " in notes) == bool(statefulsets) and all(f"StatefulSet {n} " in notes for n in statefulsets),
        f"{where}: NOTES.txt and the StatefulSets rendered ({statefulsets}) disagree",
    )
    if statefulsets:
        for text in ("`token`", "`kubeconfig`", "`value`", "argocd.argoproj.io/secret-type=cluster", "`config`"):
            f.check(text in notes, f"{where}: NOTES.txt does not mention {text} among the cluster Secret layouts")
        check_notes_count(f, notes, one(objects, "StatefulSet"), values, where)
    balancers = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment" and is_balancer(o)]
    f.check(
        ("Argo CD balancer" in notes) == bool(balancers) and all(f"deployment/{n}" in notes for n in balancers),
        f"{where}: NOTES.txt and the balancer Deployments rendered ({balancers}) disagree",
    )


def check_notes_count(f: Failures, notes: str, sts: dict[str, Any], values: dict[str, Any], where: str) -> None:
    """With `sizing.autoscale`, NOTES.txt gives the planner's range, where to see the count, and
    that a `kubectl scale` does not last; otherwise it suggests `kubectl scale`."""
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    scale = f"kubectl -n {namespace} scale statefulset {name} --replicas=N"
    sizing = values["sizing"]
    if not sizing["autoscale"]:
        f.check(
            scale in notes and "shardwise_desired_replicas" not in notes,
            f"{where}: NOTES.txt does not suggest `{scale}`, or speaks of the planner's count without sizing.autoscale",
        )
        return
    up = (
        "at once"
        if seconds(sizing["scaleUpWindow"]) == 0
        else f"once the need has been higher for sizing.scaleUpWindow ({sizing['scaleUpWindow']})"
    )
    for text in (
        "planner sets the replica count from the load",
        f"between {sizing['minReplicas']} and {sizing['maxReplicas']} replicas.",
        "shardwise_desired_replicas",
        f"kubectl -n {namespace} get statefulset {name}\n",
        "The planner overrides `kubectl scale` on its next pass",
        f"back up\n{up} to what the load needs",
        f"sizing.scaleDownWindow ({sizing['scaleDownWindow']})",
    ):
        f.check(text in notes, f"{where}: with sizing.autoscale, NOTES.txt does not say {text!r}")
    f.check(
        scale not in notes and f"with {values['replicas']} replicas" not in notes,
        f"{where}: with sizing.autoscale, NOTES.txt still gives the replicas value or suggests `{scale}`",
    )
