#!/usr/bin/env python3
"""Checks the Helm chart charts/shardwise with Helm's own engine (helm-python-sdk: Helm's Go SDK
behind a C ABI, no helm binary needed): lint, the values schema, renders of several releases,
every rendered object and CRD validated against the Kubernetes schemas (kubernetes-validate),
and what the chart promises: the RBAC of deploy/rbac.yaml, the CRDs of deploy/crds.yaml, every
controller flag set from a value, names that match, probes, security context, autoscaling (by a
HorizontalPodAutoscaler, or by the planner with `sizing.autoscale`: then no spec.replicas, and
the Role's one extra rule, on statefulsets/scale, only then), scheduling, the `helm test` Pod
and its script (run by busybox, as in the Pod), NOTES.txt, the CRDs as templates
(`crds.upgrade`), a dashboard uid per release, the PrometheusRule: the alerts of
docs/operations.md, on metrics the controller registers, checked by promtool (syntax and unit
tests), releases without the controller (`controller.enabled`), and the Argo CD balancer
(`argocdBalancer`): each value on its flag of `shardwise balance --help`, its pods out of the
controller's selectors, and its roles exactly the Role of docs/argocd.md. Also checks that
charts/shardwise/README.md is what scripts/chart_readme.py generates, and lints e2e/kind/run.sh
(`make e2e-kind` needs Docker) with shellcheck. promtool and busybox come from
scripts/prerequisites.sh; without them the checks fail.

Run by `make chart` (part of `make test`); the pinned packages are in scripts/requirements.txt.
Exits non-zero and lists every failure when a check fails.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

import chart_readme

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "shardwise"
KIND_SCRIPT = ROOT / "e2e" / "kind" / "run.sh"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ["1.25.0", "1.37.0"]
# Kinds of the Prometheus operator, for which kubernetes-validate has no schema: checked by the
# assertions below instead (port, selector, namespace).
OPERATOR_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# Chart defaults that deliberately differ from the controller's: JSON logs in a cluster.
DIFFERENT_DEFAULTS = {"SHARDWISE_LOG_FORMAT": "json"}

# Every optional part on (but the ServiceMonitor, exclusive with the PodMonitor: release "x" has
# it), under a release name without "shardwise" in it.
EVERYTHING = {
    "replicas": 5,
    "image": {"repository": "registry.example.com/shardwise", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "controller": {
        "strategy": "bounded-load",
        "loadFactor": 1.5,
        "auditFile": "/var/lib/shardwise/audit.jsonl",
        "shutdownTimeout": "1m",
        "listenAddress": "[::]",
    },
    "extraArgs": ["--log=info,kube=warn"],
    "extraEnv": [{"name": "RUST_BACKTRACE", "value": "1"}],
    "envFrom": [{"secretRef": {"name": "shardwise-env"}}, {"configMapRef": {"name": "proxy"}, "prefix": "FLEET_"}],
    "extraVolumes": [{"name": "fleet-ca", "configMap": {"name": "fleet-ca"}}],
    "extraVolumeMounts": [{"name": "fleet-ca", "mountPath": "/etc/fleet-ca", "readOnly": True}],
    "revisionHistoryLimit": 2,
    "startupProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 5, "failureThreshold": 12},
    "podAntiAffinity": "hard",
    "crds": {"upgrade": True, "keep": False},
    "tests": {"image": {"repository": "registry.example.com/busybox", "tag": "1.36.1"}, "timeoutSeconds": 30},
    "prometheusRule": {
        "enabled": True,
        "namespace": "monitoring",
        "additionalLabels": {"release": "kube-prometheus-stack"},
        "annotations": {"example.com/owner": "platform"},
        "alertLabels": {"team": "platform"},
        "alerts": {
            "ShardwiseImbalanced": {"enabled": False},
            "ShardwiseQueueBacklog": {"for": "30m", "severity": "critical", "threshold": 500},
        },
        "extraRules": [{"alert": "ShardwiseDown", "expr": 'up{job="shardwise"} == 0', "for": "5m"}],
    },
    "terminationGracePeriodSeconds": 90,
    "serviceAccount": {"annotations": {"example.com/role": "fleet"}},
    "rbac": {"create": True, "clusterSecrets": ["prod-eu-1", "prod-us-1"]},
    "podAnnotations": {"example.com/team": "platform"},
    "podLabels": {"team": "platform"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "fleet", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "shardwise"}},
        }
    ],
    "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 80},
    # Every sizing setting but `autoscale`, which the HorizontalPodAutoscaler excludes (release
    # "sized" has it).
    "sizing": {
        "appsPerReplica": 2000,
        "busyPerReplica": 2.5,
        "cachePerReplica": "512Mi",
        "minReplicas": 2,
        "maxReplicas": 40,
        "scaleUpWindow": "30s",
        "scaleDownWindow": "10m",
    },
    "metrics": {
        "certSecret": "shardwise-metrics-tls",
        "readers": [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}],
        "podMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "bearerTokenSecret": {"name": "shardwise-scraper", "key": "token"},
        },
    },
    "dashboards": {
        "enabled": True,
        "annotations": {"grafana_folder": "Shardwise"},
        "namespace": "monitoring",
    },
    # Literal application namespaces (one of them Argo CD's own, which needs no Role of its own),
    # and every setting away from its default.
    "argocdBalancer": {
        "enabled": True,
        "namespace": "gitops",
        "controller": "gitops-application-controller",
        "applicationNamespaces": ["team-a", "gitops", "team-b"],
        "load": "resources",
        "interval": 120,
        "maxExtraMoves": 7,
        "targetBalance": 1.1,
        "dryRun": True,
        "replicas": 2,
        "log": "info,shardwise_cli=debug",
    },
}

# Only the Argo CD balancer: a pattern among the application namespaces (so a ClusterRole), the
# ServiceMonitor (so a Service of its own) and the dashboard.
BALANCER_ONLY = {
    "controller": {"enabled": False},
    "argocdBalancer": {"enabled": True, "applicationNamespaces": ["team-a", "apps-*"]},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "prometheusRule": {"enabled": True},
    "dashboards": {"enabled": True},
}

# The planner sets the replicas: busyPerReplica as `--set` passes a decimal, a string.
SIZED = {
    "sizing": {"autoscale": True, "busyPerReplica": "0.75", "minReplicas": 2, "scaleDownWindow": "1h"},
}

# The one rule the Role gains with `sizing.autoscale`, and only then.
SCALE_RULE = {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["get", "update"]}

# Values the chart must refuse, by the schema or at render time, with the text expected.
INVALID = [
    ({"replicas": 0}, "replicas"),
    ({"controller": {"strategy": "random"}}, "strategy"),
    ({"controller": {"leaseDuration": "15 seconds"}}, "leaseDuration"),
    ({"controller": {"loadFactor": "1,5"}}, "loadFactor"),
    ({"controller": {"virtualNodes": 20000}}, "virtualNodes"),
    ({"controller": {"auditFile": "audit.jsonl"}}, "auditFile"),
    ({"controller": {"unknownSetting": 1}}, "unknownSetting"),
    (
        {"controller": {"leaseDuration": "10s", "renewDeadline": "10s"}},
        "renewDeadline must be at least 1s shorter",
    ),
    ({"controller": {"retryPeriod": "10s"}}, "retryPeriod must be shorter"),
    ({"terminationGracePeriodSeconds": 24}, "terminationGracePeriodSeconds (24) must exceed"),
    ({"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": None}}, "autoscaling.enabled needs"),
    ({"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}, "not both"),
    ({"rbac": {"clusterSecrets": [""]}}, "clusterSecrets"),
    ({"metrics": {"podMonitor": {"enabled": True}}}, "bearerTokenSecret"),
    ({"metrics": {"readers": [{"name": "prometheus"}]}}, "kind"),
    ({"podAntiAffinity": "sometimes"}, "podAntiAffinity"),
    ({"revisionHistoryLimit": -1}, "revisionHistoryLimit"),
    ({"envFrom": [{}]}, "envFrom"),
    ({"extraVolumeMounts": [{"name": "ca"}]}, "mountPath"),
    ({"extraVolumes": [{"configMap": {"name": "ca"}}]}, "name"),
    ({"crds": {"upgrade": "yes"}}, "upgrade"),
    ({"tests": {"image": {"tag": ""}}}, "tag"),
    ({"prometheusRule": {"alerts": {"ShardwiseTypo": {"enabled": True}}}}, "ShardwiseTypo"),
    ({"prometheusRule": {"alerts": {"ShardwiseQueueBacklog": {"threshold": "lots"}}}}, "threshold"),
    ({"prometheusRule": {"alerts": {"ShardwiseFenced": {"for": "15 minutes"}}}}, "for"),
    ({"prometheusRule": {"extraRules": [{"alert": "Empty", "expr": ""}]}}, "expr"),
    ({"controller": {"enabled": "no"}}, "enabled"),
    ({"argocdBalancer": {"enabled": True, "load": "weight"}}, "load"),
    ({"argocdBalancer": {"interval": 0}}, "interval"),
    ({"argocdBalancer": {"interval": 3601}}, "interval"),
    ({"argocdBalancer": {"interval": "30s"}}, "interval"),
    ({"argocdBalancer": {"maxExtraMoves": -1}}, "maxExtraMoves"),
    ({"argocdBalancer": {"targetBalance": "0.9"}}, "targetBalance"),
    ({"argocdBalancer": {"targetBalance": 0.5}}, "targetBalance"),
    ({"argocdBalancer": {"replicas": -1}}, "replicas"),
    ({"argocdBalancer": {"namespace": ""}}, "namespace"),
    ({"argocdBalancer": {"controller": "Argo CD"}}, "controller"),
    # Argo CD's regular expressions and glob classes, which the balancer refuses, and a comma,
    # which would split one entry into two namespaces.
    ({"argocdBalancer": {"applicationNamespaces": ["/team-.*/"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"applicationNamespaces": ["team-[ab]"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"applicationNamespaces": ["team-a,team-b"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"applicationNamespaces": ["team-a", "team-a"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"leaseName": "mine"}}, "leaseName"),
    (
        {"sizing": {"autoscale": True}, "autoscaling": {"enabled": True}},
        "sizing.autoscale and autoscaling.enabled",
    ),
    (
        {"sizing": {"minReplicas": 4, "maxReplicas": 3}},
        "sizing.minReplicas (4) must not exceed sizing.maxReplicas (3)",
    ),
    ({"sizing": {"appsPerReplica": 0}}, "appsPerReplica"),
    ({"sizing": {"busyPerReplica": 0}}, "busyPerReplica"),
    ({"sizing": {"busyPerReplica": "0.0"}}, "busyPerReplica"),
    ({"sizing": {"busyPerReplica": "1,5"}}, "busyPerReplica"),
    ({"sizing": {"cachePerReplica": "2GB"}}, "cachePerReplica"),
    ({"sizing": {"cachePerReplica": 512}}, "cachePerReplica"),
    ({"controller": {"loadMemoryWeight": 1.5}}, "loadMemoryWeight"),
    ({"sizing": {"maxReplicas": 0}}, "maxReplicas"),
    ({"sizing": {"autoscale": "yes"}}, "autoscale"),
    ({"sizing": {"scaleUpWindow": "1 minute"}}, "scaleUpWindow"),
    ({"sizing": {"scaleDownWindow": "1h1s"}}, "sizing.scaleDownWindow (1h1s) must be at most 1h"),
    ({"sizing": {"targetReplicas": 3}}, "targetReplicas"),
]


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


def controller_flags() -> dict[str, str | None]:
    """The controller's environment variables and their defaults, from its own --help."""
    cargo = os.environ.get("CARGO", "cargo")
    help_text = subprocess.run(
        [cargo, "run", "--quiet", "-p", "shardwise-controller", "--", "--help"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    flags: dict[str, str | None] = {}
    for block in re.split(r"\n(?=\s*(?:-[a-zA-Z], )?--[a-z])", help_text):
        env = re.search(r"\[env: ([A-Z_]+)=", block)
        if env:
            default = re.search(r"\[default: ([^\]]*)\]", block)
            flags[env.group(1)] = default.group(1) if default else None
    return flags


def balance_options() -> tuple[set[str], set[str]]:
    """The long flags and environment variables of `shardwise balance`, from its own --help."""
    cargo = os.environ.get("CARGO", "cargo")
    help_text = subprocess.run(
        [cargo, "run", "--quiet", "-p", "shardwise-cli", "--bin", "shardwise", "--", "balance", "--help"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    flags = set(re.findall(r"^\s*(?:-[a-zA-Z], )?(--[a-z][a-z-]*)", help_text, re.M))
    env = set(re.findall(r"\[env: ([A-Z_]+)=", help_text))
    if not {"--namespace", "--interval"} <= flags or "POD_NAME" not in env:
        raise AssertionError("could not read the flags of `shardwise balance --help`: update balance_options()")
    return flags, env


Rule = tuple[str, str, str]


def rule_set(rules: list[dict[str, Any]]) -> set[Rule]:
    """RBAC rules as (API group, resource, verb) triples, so that differently grouped rules compare."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def docs_balancer_rules() -> set[Rule]:
    """The rules of the `shardwise-argocd-balancer` Role that docs/argocd.md gives."""
    text = (ROOT / "docs" / "argocd.md").read_text()
    for block in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S):
        role = yaml.safe_load(block)
        if isinstance(role, dict) and role.get("kind") == "Role":
            if role["metadata"]["name"] == "shardwise-argocd-balancer":
                return rule_set(role["rules"])
    raise AssertionError("docs/argocd.md has no yaml block of the Role shardwise-argocd-balancer")


def is_balancer(o: dict[str, Any]) -> bool:
    return o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "argocd-balancer"


def check_no_controller(f: Failures, objects: list[dict[str, Any]], where: str) -> None:
    """`controller.enabled: false`: none of the controller's objects, only CRDs and the dashboard."""
    left = sorted(
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] not in ("CustomResourceDefinition", "ConfigMap")
    )
    f.check(not left, f"{where}: controller.enabled is false, yet the controller's {left} are rendered")


def check_balancer(
    f: Failures,
    objects: list[dict[str, Any]],
    values: dict[str, Any],
    namespace: str,
    options: tuple[set[str], set[str]],
    docs_rules: set[Rule],
    where: str,
) -> None:
    """The Argo CD balancer: nothing when off; when on, a Deployment whose every value reaches its
    flag, pods no selector of the controller takes, and exactly the roles of docs/argocd.md."""
    b, c = values["argocdBalancer"], values["controller"]
    mine = [o for o in objects if is_balancer(o)]
    if not b["enabled"]:
        f.check(not mine, f"{where}: balancer objects rendered although argocdBalancer.enabled is false: {mine}")
        return
    flags, env_names = options
    deployment = one(mine, "Deployment")
    name = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = env_of(container)
    f.check(
        container["command"] == ["/usr/local/bin/shardwise", "balance"],
        f"{where}: the balancer runs {container['command']}, not the CLI's balance",
    )
    f.check(
        container["image"] == one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["image"]
        if c["enabled"]
        else container["image"].startswith(values["image"]["repository"] + ":"),
        f"{where}: the balancer's image {container['image']} is not the controller's",
    )
    f.check(deployment["spec"]["replicas"] == b["replicas"], f"{where}: balancer replicas")

    args = container["args"]
    given = {a.split("=", 1)[0] for a in args}
    f.check(given <= flags, f"{where}: flags `shardwise balance` does not have: {sorted(given - flags)}")
    expected = [
        f"--namespace={b['namespace']}",
        f"--statefulset={b['controller']}",
        *([f"--app-namespaces={','.join(b['applicationNamespaces'])}"] if b["applicationNamespaces"] else []),
        f"--load={b['load']}",
        f"--interval={b['interval']}",
        f"--max-extra-moves={b['maxExtraMoves']}",
        f"--target-balance={b['targetBalance']}",
        f"--lease-name={name}",
        f"--metrics-addr={c['listenAddress']}:{c['metricsPort']}",
        f"--health-addr={c['listenAddress']}:{c['healthPort']}",
        *(["--dry-run"] if b["dryRun"] else []),
    ]
    f.check(args == expected, f"{where}: balancer arguments {args}, expected {expected}")
    f.check(
        env
        == {
            "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
            "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            "SHARDWISE_LOG_FORMAT": c["logFormat"],
            "SHARDWISE_LOG": b["log"],
        }
        and set(env) <= env_names,
        f"{where}: balancer environment {env}",
    )
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    f.check(ports == {"metrics": c["metricsPort"], "health": c["healthPort"]}, f"{where}: balancer ports {ports}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container.get(probe, {}).get("httpGet", {})
        f.check(get == {"path": path, "port": "health"}, f"{where}: balancer {probe} is not {path} on health")
    security = container["securityContext"]
    f.check(
        security == values["securityContext"]
        and security.get("runAsNonRoot") is True
        and security.get("readOnlyRootFilesystem") is True
        and security.get("allowPrivilegeEscalation") is False
        and pod["spec"]["securityContext"] == values["podSecurityContext"],
        f"{where}: the balancer's security context is not the controller's restricted one: {security}",
    )
    f.check(container["resources"] == b["resources"], f"{where}: balancer resources")

    # Its pods: its own selector takes them; none of the controller's does.
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    f.check(selector.items() <= labels.items(), f"{where}: the balancer's selector does not take its pods")
    selecting = ("StatefulSet", "Service", "PodDisruptionBudget", "ServiceMonitor", "PodMonitor")
    controller_selectors = [
        (o["kind"], o["spec"]["selector"] if o["kind"] == "Service" else o["spec"]["selector"]["matchLabels"])
        for o in objects
        if not is_balancer(o) and o["kind"] in selecting
    ]
    f.check(
        not c["enabled"] or len(controller_selectors) >= 2,
        f"{where}: the controller's selectors were not found: {controller_selectors}",
    )
    taken = [kind for kind, s in controller_selectors if s.items() <= labels.items()]
    f.check(not taken, f"{where}: the controller's {taken} select the balancer's pods")

    service_accounts = [o for o in mine if o["kind"] == "ServiceAccount"]
    f.check(
        [o["metadata"]["name"] for o in service_accounts] == [pod["spec"]["serviceAccountName"]],
        f"{where}: the balancer does not run as its own ServiceAccount",
    )
    subject = [{"kind": "ServiceAccount", "name": pod["spec"]["serviceAccountName"], "namespace": namespace}]
    roles = [o for o in mine if o["kind"] in ("Role", "ClusterRole")]
    bindings = [o for o in mine if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    if not values["rbac"]["create"]:
        f.check(not roles and not bindings, f"{where}: balancer roles rendered although rbac.create is false")
    else:
        granted = set().union(*(rule_set(o["rules"]) for o in roles))
        f.check(
            granted == docs_rules,
            f"{where}: the balancer's roles grant {sorted(granted - docs_rules)} beyond docs/argocd.md's Role "
            f"and miss {sorted(docs_rules - granted)}",
        )
        # Every role bound to the balancer alone, by a binding of the same name and namespace.
        for role in roles:
            kind, role_name = role["kind"], role["metadata"]["name"]
            binding = [
                o
                for o in bindings
                if o["metadata"]["name"] == role_name
                and o["metadata"].get("namespace") == role["metadata"].get("namespace")
            ]
            f.check(
                len(binding) == 1
                and binding[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role_name}
                and binding[0]["subjects"] == subject,
                f"{where}: {kind} {role_name} is not bound to the balancer alone: {binding}",
            )
        f.check(len(bindings) == len(roles), f"{where}: {len(bindings)} balancer bindings for {len(roles)} roles")
        by_namespace: dict[str, set[Rule]] = {}
        for o in roles:
            if o["kind"] == "Role":
                by_namespace.setdefault(o["metadata"]["namespace"], set()).update(rule_set(o["rules"]))
        # The chart splits the docs' Role: its Lease rules go to the release namespace.
        lease = {r for r in docs_rules if r[:2] == ("coordination.k8s.io", "leases")}
        f.check(by_namespace.get(namespace, set()) >= lease, f"{where}: no Role for the Lease in {namespace}")
        f.check(
            lease.isdisjoint(by_namespace.get(b["namespace"], set())) or b["namespace"] == namespace,
            f"{where}: Argo CD's namespace holds the Lease rule, which belongs to the release namespace",
        )
        patterns = [n for n in b["applicationNamespaces"] if re.search(r"[*?]", n)]
        cluster_roles = [o for o in roles if o["kind"] == "ClusterRole"]
        list_apps = {("argoproj.io", "applications", "list")}
        literal = set(b["applicationNamespaces"]) - {b["namespace"]}
        if patterns:
            f.check(
                len(cluster_roles) == 1 and rule_set(cluster_roles[0]["rules"]) == list_apps,
                f"{where}: application namespace patterns {patterns} need one ClusterRole to list "
                f"Applications, got {cluster_roles}",
            )
            f.check(
                not literal & set(by_namespace),
                f"{where}: Roles in {sorted(literal & set(by_namespace))} besides the ClusterRole",
            )
        else:
            f.check(not cluster_roles, f"{where}: a ClusterRole for literal application namespaces")
            for ns in literal:
                f.check(by_namespace.get(ns) == list_apps, f"{where}: no Role listing the Applications of {ns}")
            f.check(
                set(by_namespace) == literal | {namespace, b["namespace"]},
                f"{where}: balancer Roles in {sorted(by_namespace)}",
            )

    # Scraped as the controller is, by the same switch, over plain HTTP: it serves no TLS.
    for kind, key in (("ServiceMonitor", "serviceMonitor"), ("PodMonitor", "podMonitor")):
        settings = values["metrics"][key]
        found = [o for o in mine if o["kind"] == kind]
        if not f.check(
            len(found) == int(settings["enabled"]), f"{where}: balancer {kind} rendered {len(found)} times"
        ):
            continue
        for monitor in found:
            endpoints = monitor["spec"].get("endpoints") or monitor["spec"].get("podMetricsEndpoints")
            f.check(
                [(e["port"], e["path"], e.get("scheme", "http")) for e in endpoints]
                == [("metrics", "/metrics", "http")]
                and endpoints[0]["interval"] == settings["interval"]
                and settings["labels"].items() <= monitor["metadata"]["labels"].items(),
                f"{where}: the balancer's {kind} does not scrape /metrics over http as metrics.{key} "
                f"says: {endpoints}",
            )
            f.check(
                monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
                and monitor["spec"]["selector"]["matchLabels"] == selector,
                f"{where}: the balancer's {kind} does not select its pods",
            )
    services = [o for o in mine if o["kind"] == "Service"]
    if values["metrics"]["serviceMonitor"]["enabled"]:
        f.check(
            len(services) == 1
            and services[0]["spec"]["selector"] == selector
            and [p["name"] for p in services[0]["spec"]["ports"]] == ["metrics"],
            f"{where}: the balancer's ServiceMonitor has no Service of its pods' metrics port",
        )
    else:
        f.check(not services, f"{where}: a balancer Service without a ServiceMonitor")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def check_release(
    f: Failures,
    objects: list[dict[str, Any]],
    values: dict[str, Any],
    release: str,
    namespace: str,
    flags: dict[str, str | None],
) -> None:
    """What every release must satisfy, whatever its values."""
    sts = one(objects, "StatefulSet")
    name = sts["metadata"]["name"]
    service = one(objects, "Service")
    pod = sts["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = env_of(container)
    c = values["controller"]
    where = f"release {release!r}"

    for o in objects:
        if o["kind"] == "ConfigMap" and values["dashboards"]["namespace"]:
            f.check(
                o["metadata"]["namespace"] == values["dashboards"]["namespace"],
                f"{where}: dashboard namespace",
            )
        elif o["kind"] == "PrometheusRule" and values["prometheusRule"]["namespace"]:
            f.check(
                o["metadata"]["namespace"] == values["prometheusRule"]["namespace"],
                f"{where}: PrometheusRule namespace",
            )
        elif o["kind"] == "CustomResourceDefinition":
            f.check("namespace" not in o["metadata"], f"{where}: CRD {o['metadata']['name']} has a namespace")
        elif o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            # Cluster-scoped, so named after the release and its namespace: two releases of the
            # same name in different namespaces do not collide.
            f.check(
                "namespace" not in o["metadata"] and f"-{namespace}-" in o["metadata"]["name"],
                f"{where}: {o['kind']} {o['metadata']['name']} is not cluster-scoped and named for {namespace}",
            )
        else:
            f.check(o["metadata"].get("namespace") == namespace, f"{where}: {o['kind']} not in {namespace}")
    f.check(len(name) <= 52, f"{where}: StatefulSet name {name!r} longer than 52 characters")
    f.check(
        sts["spec"].get("revisionHistoryLimit") == values["revisionHistoryLimit"],
        f"{where}: revisionHistoryLimit {sts['spec'].get('revisionHistoryLimit')}",
    )
    f.check(env.get("SHARDWISE_STATEFULSET") == name, f"{where}: SHARDWISE_STATEFULSET is not {name!r}")
    f.check(
        env.get("POD_NAME") == {"fieldRef": {"fieldPath": "metadata.name"}},
        f"{where}: POD_NAME not from the downward API",
    )
    f.check(
        env.get("POD_NAMESPACE") == {"fieldRef": {"fieldPath": "metadata.namespace"}},
        f"{where}: POD_NAMESPACE not from the downward API",
    )
    f.check(
        sts["spec"]["serviceName"] == service["metadata"]["name"], f"{where}: serviceName is not the Service"
    )
    f.check(service["spec"].get("clusterIP") == "None", f"{where}: the Service is not headless")
    selector = sts["spec"]["selector"]["matchLabels"]
    f.check(
        selector.items() <= pod["metadata"]["labels"].items(),
        f"{where}: selector does not match the pod labels",
    )
    f.check(
        service["spec"]["selector"] == selector, f"{where}: Service selector differs from the StatefulSet's"
    )

    # Every flag of the controller comes from a value (its SHARDWISE_* variable), except the
    # audit file when off and the busy time and cache per replica when empty; nothing is set that the
    # controller does not read.
    chart_env = {k for k in env if k.startswith("SHARDWISE_") or k.startswith("POD_")}
    secure = values["metrics"]["secure"]
    cert_dir = secure and values["metrics"]["certSecret"]
    sizing = values["sizing"]
    expected = (
        set(flags)
        - ({"SHARDWISE_AUDIT_FILE"} if not c["auditFile"] else set())
        - ({"SHARDWISE_METRICS_CERT_DIR"} if not cert_dir else set())
        - ({"SHARDWISE_BUSY_PER_REPLICA"} if sizing["busyPerReplica"] is None else set())
        - ({"SHARDWISE_CACHE_PER_REPLICA"} if sizing["cachePerReplica"] is None else set())
    )
    f.check(
        chart_env == expected,
        f"{where}: controller variables differ: chart only {sorted(chart_env - expected)}, "
        f"controller only {sorted(expected - chart_env)}",
    )

    sizing_env = {
        "SHARDWISE_ITEMS_PER_REPLICA": str(sizing["appsPerReplica"]),
        "SHARDWISE_MIN_REPLICAS": str(sizing["minReplicas"]),
        "SHARDWISE_MAX_REPLICAS": str(sizing["maxReplicas"]),
        "SHARDWISE_AUTOSCALE": str(sizing["autoscale"]).lower(),
        "SHARDWISE_SCALE_UP_WINDOW": sizing["scaleUpWindow"],
        "SHARDWISE_SCALE_DOWN_WINDOW": sizing["scaleDownWindow"],
        "SHARDWISE_BUSY_PER_REPLICA": None if sizing["busyPerReplica"] is None else str(sizing["busyPerReplica"]),
        "SHARDWISE_CACHE_PER_REPLICA": sizing["cachePerReplica"],
    }
    got = {k: env.get(k) for k in sizing_env}
    f.check(got == sizing_env, f"{where}: sizing variables {got} are not the values {sizing_env}")

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    f.check(
        ports == {"metrics": c["metricsPort"], "health": c["healthPort"]}, f"{where}: container ports {ports}"
    )
    f.check(
        env.get("SHARDWISE_METRICS_ADDR") == f"{c['listenAddress']}:{c['metricsPort']}",
        f"{where}: metrics address",
    )
    f.check(
        env.get("SHARDWISE_HEALTH_ADDR") == f"{c['listenAddress']}:{c['healthPort']}",
        f"{where}: health address",
    )
    # Secure metrics: the flag, the certificate mounted where the controller reads it, the
    # reviews granted, a reader role, and monitors that scrape over https with a token.
    f.check(env.get("SHARDWISE_METRICS_SECURE") == str(secure).lower(), f"{where}: metrics secure flag")
    if cert_dir:
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        f.check(
            mounts.get("metrics-tls", {}).get("mountPath") == env.get("SHARDWISE_METRICS_CERT_DIR")
            and volumes.get("metrics-tls", {}).get("secret", {}).get("secretName") == cert_dir,
            f"{where}: metrics certificate Secret not mounted at SHARDWISE_METRICS_CERT_DIR",
        )
    cluster_roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    if values["rbac"]["create"]:
        auth_rules = [r for o in cluster_roles.values() for r in o["rules"] if "resources" in r]
        f.check(
            sorted(r for rule in auth_rules for r in rule["resources"])
            == (["subjectaccessreviews", "tokenreviews"] if secure else []),
            f"{where}: review rules {auth_rules}",
        )
        readers = [o for o in cluster_roles.values() if o["metadata"]["name"].endswith("-metrics-reader")]
        f.check(
            len(readers) == int(secure)
            and all(o["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}] for o in readers),
            f"{where}: metrics-reader ClusterRole",
        )
        bound = [
            o["subjects"]
            for o in objects
            if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"].endswith("-metrics-reader")
        ]
        f.check(
            bound == ([values["metrics"]["readers"]] if secure and values["metrics"]["readers"] else []),
            f"{where}: metrics readers bound {bound}",
        )
    for monitor in (o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")):
        endpoint = (monitor["spec"].get("endpoints") or monitor["spec"].get("podMetricsEndpoints"))[0]
        token = endpoint.get("bearerTokenFile") or endpoint.get("authorization", {}).get("credentials")
        f.check(
            (endpoint.get("scheme") == "https" and bool(token)) if secure else "scheme" not in endpoint,
            f"{where}: {monitor['kind']} scrapes {endpoint.get('scheme', 'http')} with token {token!r}",
        )

    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container.get(probe, {}).get("httpGet", {})
        f.check(
            get.get("path") == path and get.get("port") == "health",
            f"{where}: {probe} is not {path} on health",
        )

    security = container["securityContext"]
    f.check(
        security.get("runAsNonRoot") is True and pod["spec"]["securityContext"].get("runAsNonRoot") is True,
        f"{where}: not runAsNonRoot",
    )
    f.check(pod["spec"]["securityContext"].get("runAsUser", 0) != 0, f"{where}: runs as root")
    f.check(security.get("readOnlyRootFilesystem") is True, f"{where}: root filesystem writable")
    f.check(security.get("allowPrivilegeEscalation") is False, f"{where}: privilege escalation allowed")
    f.check(security.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities not all dropped")
    f.check(bool(container.get("resources", {}).get("requests")), f"{where}: no resource requests")

    grace = pod["spec"]["terminationGracePeriodSeconds"]
    needed = seconds(c["shutdownTimeout"]) + seconds(c["renewDeadline"]) / 2
    f.check(
        grace > needed,
        f"{where}: terminationGracePeriodSeconds {grace} <= shutdown plus lease release {needed}",
    )

    if values["serviceAccount"]["create"]:
        sa = one(objects, "ServiceAccount")
        f.check(
            pod["spec"]["serviceAccountName"] == sa["metadata"]["name"],
            f"{where}: pod does not use the ServiceAccount",
        )
    if values["rbac"]["create"]:
        binding = one(objects, "RoleBinding")
        f.check(
            binding["roleRef"]["name"] == one(objects, "Role")["metadata"]["name"],
            f"{where}: RoleBinding role",
        )
        f.check(
            binding["subjects"]
            == [
                {"kind": "ServiceAccount", "name": pod["spec"]["serviceAccountName"], "namespace": namespace}
            ],
            f"{where}: RoleBinding subject",
        )
        # Secrets: get only, and only those named when names are given.
        secret_rules = [r for r in one(objects, "Role")["rules"] if "secrets" in r["resources"]]
        names = values["rbac"].get("clusterSecrets") or []
        f.check(
            len(secret_rules) == 1
            and secret_rules[0]["resources"] == ["secrets"]
            and secret_rules[0]["verbs"] == ["get"]
            and secret_rules[0].get("resourceNames", []) == names,
            f"{where}: the Role's rule on Secrets is not get on {names or 'all'}: {secret_rules}",
        )
        # The scale subresource: get and update, only for the planner that sets the count.
        scale_rules = [r for r in one(objects, "Role")["rules"] if "statefulsets/scale" in r["resources"]]
        f.check(
            scale_rules == ([SCALE_RULE] if sizing["autoscale"] else []),
            f"{where}: with sizing.autoscale {sizing['autoscale']}, the Role's statefulsets/scale rules are "
            f"{scale_rules}",
        )

    hpa = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    if values["autoscaling"]["enabled"]:
        f.check("replicas" not in sts["spec"], f"{where}: spec.replicas set although an HPA owns the count")
        f.check(
            len(hpa) == 1
            and hpa[0]["spec"]["scaleTargetRef"]
            == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
            f"{where}: HPA does not target the StatefulSet",
        )
    elif sizing["autoscale"]:
        f.check(
            "replicas" not in sts["spec"] and not hpa,
            f"{where}: spec.replicas set, or an HPA rendered, although the planner owns the count",
        )
    else:
        f.check(
            sts["spec"].get("replicas") == values["replicas"] and not hpa,
            f"{where}: replicas without autoscaling",
        )
    if values["podDisruptionBudget"]["enabled"]:
        f.check(
            one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector,
            f"{where}: PDB selector",
        )

    for kind, key in (("ServiceMonitor", "serviceMonitor"), ("PodMonitor", "podMonitor")):
        found = [o for o in objects if o["kind"] == kind]
        if not f.check(
            len(found) == int(values["metrics"][key]["enabled"]),
            f"{where}: {kind} rendered {len(found)} times",
        ):
            continue
        for monitor in found:
            endpoints = monitor["spec"].get("endpoints") or monitor["spec"].get("podMetricsEndpoints")
            f.check(
                [e["port"] for e in endpoints] == ["metrics"] and endpoints[0]["path"] == "/metrics",
                f"{where}: {kind} does not scrape the metrics port",
            )
            f.check(monitor["spec"]["selector"]["matchLabels"] == selector, f"{where}: {kind} selector")
            f.check(
                monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]},
                f"{where}: {kind} namespaces",
            )
            f.check(
                values["metrics"][key]["labels"].items() <= monitor["metadata"]["labels"].items(),
                f"{where}: {kind} labels",
            )

    dashboards = [o for o in objects if o["kind"] == "ConfigMap"]
    if values["dashboards"]["enabled"]:
        d = values["dashboards"]
        f.check(
            len(dashboards) == 1 and dashboards[0]["metadata"]["labels"].get(d["label"]) == d["labelValue"],
            f"{where}: dashboard ConfigMap without the sidecar label",
        )
        shipped = json.loads((CHART / "dashboards" / "shardwise.json").read_text())
        served = json.loads(dashboards[0]["data"]["shardwise.json"])
        f.check(
            {k: v for k, v in served.items() if k not in ("uid", "title")}
            == {k: v for k, v in shipped.items() if k not in ("uid", "title")},
            f"{where}: dashboard differs from the file (uid and title aside)",
        )
        f.check(
            served["title"] == f"{shipped['title']} ({namespace}/{release})",
            f"{where}: dashboard title {served['title']!r} does not name the release",
        )
        f.check(
            re.fullmatch(r"[A-Za-z0-9_-]{1,40}", served["uid"]) is not None and served["uid"] != shipped["uid"],
            f"{where}: dashboard uid {served['uid']!r} is the file's or not a valid Grafana uid",
        )
    else:
        f.check(not dashboards, f"{where}: dashboard rendered although disabled")

    check_pod_options(f, pod, container, values, selector, where)
    check_test_pod(f, objects, values, name, service["metadata"]["name"], namespace, selector, where)
    check_crd_templates(f, objects, values, where)
    check_prometheus_rule(f, objects, values, namespace, where)

    if c["auditFile"]:
        mount = container["volumeMounts"][0]["mountPath"]
        f.check(
            c["auditFile"].startswith(mount + "/"),
            f"{where}: audit file {c['auditFile']} not on a writable volume",
        )


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


def check_pod_options(
    f: Failures,
    pod: dict[str, Any],
    container: dict[str, Any],
    values: dict[str, Any],
    selector: dict[str, str],
    where: str,
) -> None:
    """Scheduling, probes, extra environment and volumes: what the values ask, and no more."""
    spec = pod["spec"]
    f.check(
        container.get("envFrom", []) == values["envFrom"], f"{where}: envFrom {container.get('envFrom')}"
    )
    mounts = container.get("volumeMounts", [])
    volumes = spec.get("volumes", [])
    f.check(
        mounts[len(mounts) - len(values["extraVolumeMounts"]) :] == values["extraVolumeMounts"]
        and volumes[len(volumes) - len(values["extraVolumes"]) :] == values["extraVolumes"],
        f"{where}: extra volumes or mounts missing",
    )
    names = [v["name"] for v in volumes]
    f.check(len(names) == len(set(names)), f"{where}: volume names repeat: {names}")
    f.check(
        {m["name"] for m in mounts} <= set(names), f"{where}: a mount names no volume: {mounts} {names}"
    )
    if values["startupProbe"]:
        f.check(
            container.get("startupProbe") == values["startupProbe"]
            and container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"},
            f"{where}: startupProbe {container.get('startupProbe')} is not the value on /healthz",
        )
    else:
        f.check("startupProbe" not in container, f"{where}: startupProbe rendered although {{}}")

    affinity = spec.get("affinity")
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector}}
    if values["affinity"]:
        f.check(affinity == values["affinity"], f"{where}: affinity is not the value, whole")
    elif values["podAntiAffinity"] == "soft":
        f.check(
            affinity
            == {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
                }
            },
            f"{where}: no soft anti-affinity on the replicas' labels: {affinity}",
        )
    elif values["podAntiAffinity"] == "hard":
        f.check(
            affinity == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
            f"{where}: no hard anti-affinity on the replicas' labels: {affinity}",
        )
    else:
        f.check(affinity is None, f"{where}: affinity {affinity} although podAntiAffinity is none")


# The test container's own securityContext: busybox runs as root by default, so the user is set
# here and not left to podSecurityContext, with every field of the restricted Pod Security Standard.
TEST_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def check_test_pod(
    f: Failures,
    objects: list[dict[str, Any]],
    values: dict[str, Any],
    statefulset: str,
    service: str,
    namespace: str,
    selector: dict[str, str],
    where: str,
) -> None:
    """`helm test`: one hook Pod asking every replica's /readyz by its pod DNS name."""
    tests = [o for o in objects if o["kind"] == "Pod"]
    if not values["tests"]["enabled"]:
        f.check(not tests, f"{where}: test Pod rendered although tests.enabled is false")
        return
    if not f.check(len(tests) == 1, f"{where}: {len(tests)} test Pods"):
        return
    test = tests[0]
    annotations = test["metadata"].get("annotations", {})
    f.check(annotations.get("helm.sh/hook") == "test", f"{where}: the test Pod is not a test hook")
    f.check(
        not selector.items() <= test["metadata"]["labels"].items(),
        f"{where}: the test Pod carries the replicas' selector labels (the Service and PDB would count it)",
    )
    f.check(
        test["spec"].get("automountServiceAccountToken") is False and "serviceAccountName" not in test["spec"],
        f"{where}: the test Pod gets API credentials it does not need",
    )
    container = test["spec"]["containers"][0]
    image = values["tests"]["image"]
    f.check(
        container["image"] == f"{image['repository']}:{image['tag']}", f"{where}: test image {container['image']}"
    )
    f.check(
        container["securityContext"] == TEST_SECURITY_CONTEXT,
        f"{where}: the test container's own securityContext is not the restricted one with user "
        f"65532: {container['securityContext']}",
    )
    # An autoscaler's or the planner's count may be anything from its minimum up.
    if values["autoscaling"]["enabled"]:
        replicas = values["autoscaling"]["minReplicas"]
    elif values["sizing"]["autoscale"]:
        replicas = values["sizing"]["minReplicas"]
    else:
        replicas = values["replicas"]
    port = values["controller"]["healthPort"]
    expected = [f"http://{statefulset}-{i}.{service}.{namespace}.svc:{port}/readyz" for i in range(replicas)]
    f.check(
        [a for a in container["args"] if a.startswith("http://")] == expected,
        f"{where}: the test does not ask each of the {replicas} replicas' /readyz: {container['args'][1:]}",
    )
    f.check(
        f"+ {values['tests']['timeoutSeconds']} ))" in container["args"][0], f"{where}: test timeout not applied"
    )


def crd_documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((CHART / "crds" / "crds.yaml").read_text()) if d]


def check_crd_templates(f: Failures, objects: list[dict[str, Any]], values: dict[str, Any], where: str) -> None:
    """`crds.upgrade`: the CRDs of crds/ as release objects, kept on uninstall with `crds.keep`."""
    rendered = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    if not values["crds"]["upgrade"]:
        f.check(not rendered, f"{where}: CRDs rendered as templates although crds.upgrade is false")
        return
    keep = values["crds"]["keep"]
    for o in rendered:
        policy = o["metadata"].get("annotations", {}).get("helm.sh/resource-policy")
        f.check(policy == ("keep" if keep else None), f"{where}: CRD {o['metadata']['name']} resource policy {policy}")
        f.check(
            o["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "Helm",
            f"{where}: CRD {o['metadata']['name']} without the release's labels",
        )
    bare = [dict(o, metadata={"name": o["metadata"]["name"]}) for o in rendered]
    f.check(bare == crd_documents(), f"{where}: the CRD templates differ from crds/crds.yaml (labels aside)")


# What kubernetes-validate cannot check of a PrometheusRule: the parts Prometheus reads.
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                        "record": {"type": "string", "minLength": 1},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"},
                                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def check_prometheus_rule(
    f: Failures, objects: list[dict[str, Any]], values: dict[str, Any], namespace: str, where: str
) -> None:
    """The PrometheusRule: the structure Prometheus reads, the alerts enabled with their settings,
    every selector narrowed to the release namespace, the user's extra rules."""
    v = values["prometheusRule"]
    found = [o for o in objects if o["kind"] == "PrometheusRule"]
    # Nothing to carry (every alert off, no extraRules): no PrometheusRule, not an empty group.
    carries = any(a["enabled"] for a in v["alerts"].values()) or bool(v["extraRules"])
    if not f.check(
        len(found) == int(v["enabled"] and carries),
        f"{where}: PrometheusRule rendered {len(found)} times (enabled {v['enabled']}, any rule {carries})",
    ):
        return
    if not found:
        return
    rule = found[0]
    errors = sorted(jsonschema.Draft202012Validator(PROMETHEUS_RULE_SCHEMA).iter_errors(rule), key=str)
    for e in errors:
        f.check(False, f"{where}: PrometheusRule at {'.'.join(map(str, e.absolute_path))}: {e.message}")
    if errors:
        return
    f.check(
        v["additionalLabels"].items() <= rule["metadata"]["labels"].items()
        and v["annotations"].items() <= rule["metadata"].get("annotations", {}).items(),
        f"{where}: PrometheusRule labels or annotations",
    )
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    ours = rules[: len(rules) - len(v["extraRules"])]
    f.check(rules[len(ours) :] == v["extraRules"], f"{where}: extraRules not appended as given")
    enabled = [name for name, a in v["alerts"].items() if a["enabled"]]
    f.check(
        sorted(r.get("alert", "") for r in ours) == sorted(enabled),
        f"{where}: alerts {sorted(r.get('alert', '') for r in ours)}, enabled {sorted(enabled)}",
    )
    matcher = f'namespace="{namespace}"'
    for r in ours:
        settings = v["alerts"].get(r["alert"], {})
        f.check(
            r.get("for") == settings.get("for")
            and r["labels"] == {"severity": settings.get("severity"), **v["alertLabels"]},
            f"{where}: {r['alert']}: for {r.get('for')}, labels {r['labels']}, not the values' {settings}",
        )
        if "threshold" in settings:
            f.check(
                re.search(rf"(^|\s){re.escape(str(settings['threshold']))}(\s|$)", r["expr"]) is not None,
                f"{where}: {r['alert']}: threshold {settings['threshold']} not in {r['expr']!r}",
            )
        for metric, labels in re.findall(r"\b(shardwise_[a-z_]+)(\{[^}]*\})?", r["expr"]):
            f.check(
                labels.startswith("{" + matcher),
                f"{where}: {r['alert']}: {metric} is not narrowed to {matcher}",
            )
        f.check(
            {"summary", "description", "runbook_url"} <= r["annotations"].keys(),
            f"{where}: {r['alert']}: annotations {sorted(r['annotations'])}",
        )


def exposed_metrics() -> set[str]:
    """The sample names shardwise-controller exposes, from the runtime's registrations
    (crates/shardwise-runtime/src/metrics.rs) and the controller's nouns: `_total` for counters,
    `_bucket`, `_sum` and `_count` for histograms. Fails loudly if the parse misses one."""
    source = (ROOT / "crates" / "shardwise-runtime" / "src" / "metrics.rs").read_text()
    fleet = (ROOT / "crates" / "shardwise-controller" / "src" / "fleet.rs").read_text()
    nouns = dict(re.findall(r"\b(unit|units|item|items): \"([a-z_]+)\"", fleet))
    kinds = dict(re.findall(r"pub(?:\(crate\))? (\w+): Family<\w+, (Gauge|Counter|Histogram)\b", source))
    body = source[source.index("fn register_replica(") : source.index("fn start_at_zero")]
    calls = re.findall(r'r\.register\(\s*(?:format!\(\s*)?"([a-z_{}]+)"\)?,.*?self\.(\w+)\.clone\(\)', body, re.S)
    if len(calls) != body.count("r.register(") or set(nouns) != {"unit", "units", "item", "items"}:
        raise AssertionError("could not read the metric registrations of metrics.rs: update exposed_metrics()")
    names = set()
    for template, field in calls:
        base = "shardwise_" + template.format(**nouns)
        suffixes = {"Counter": ["_total"], "Histogram": ["_bucket", "_sum", "_count"], "Gauge": [""]}[kinds[field]]
        names.update(base + suffix for suffix in suffixes)
    return names


def docs_alerts() -> dict[str, dict[str, str]]:
    """The table of docs/operations.md, "Metrics worth an alert": name -> expr, for, severity."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("### Metrics worth an alert") :]
    section = section[: section.index("\n## ")]
    alerts = {}
    for row in re.findall(r"^\|.*\(`(Shardwise\w+)`\) \| `(.*)` \| (\w+) \| (\w+) \|$", section, re.M):
        name, expr, duration, severity = row
        alerts[name] = {"expr": expr.replace("\\|", "|"), "for": duration, "severity": severity}
    return alerts


def unscoped(expr: str, namespace: str) -> str:
    """A rendered expression without the release-namespace matcher: the docs' form."""
    matcher = f'namespace="{namespace}"'
    return expr.replace("{" + matcher + "}", "").replace("{" + matcher + ",", "{")


# Unit tests of the default alerts for `promtool test rules`, on the rules of a release in namespace
# "shardwise": per alert, series of a broken fleet (which must fire, with these labels, and must
# not fire when the same series come from another namespace) and of a healthy one (silent).
P0 = {"pod": "shardwise-0", "shard": "0"}
P1 = {"pod": "shardwise-1", "shard": "1"}
P2 = {"pod": "shardwise-2", "shard": "2"}
LEADER = [("shardwise_planner_leader", P0, "1x90"), ("shardwise_planner_leader", P1, "0x90")]
BUCKETS = ["5.12", "10.24", "20.48", "+Inf"]
ALERT_TESTS: list[dict[str, Any]] = [
    {
        "alert": "ShardwiseShardMissing",
        "at": "10m",
        "broken": LEADER
        + [
            ("shardwise_members", {"pod": "shardwise-0", "state": "expected"}, "3x20"),
            ("shardwise_members", {"pod": "shardwise-0", "state": "live"}, "2x20"),
        ],
        "healthy": LEADER
        + [
            ("shardwise_members", {"pod": "shardwise-0", "state": "expected"}, "3x20"),
            ("shardwise_members", {"pod": "shardwise-0", "state": "live"}, "3x20"),
            # A former planner's stale view: not the planner's, so not read.
            ("shardwise_members", {"pod": "shardwise-1", "state": "expected"}, "4x20"),
            ("shardwise_members", {"pod": "shardwise-1", "state": "live"}, "2x20"),
        ],
        "labels": {"severity": "critical"},
    },
    {
        "alert": "ShardwiseNoPlanner",
        "at": "5m",
        "broken": [
            ("shardwise_lease_held", P0, "1x10"),
            ("shardwise_lease_held", P1, "1x10"),
            ("shardwise_planner_leader", P0, "0x10"),
            ("shardwise_planner_leader", P1, "0x10"),
        ],
        "healthy": [("shardwise_lease_held", P0, "1x10"), ("shardwise_lease_held", P1, "1x10")] + LEADER,
        "labels": {"severity": "critical"},
    },
    {
        "alert": "ShardwiseLeaseNotHeld",
        "at": "10m",
        "broken": [("shardwise_lease_held", P0, "1x20"), ("shardwise_lease_held", P1, "0x20")],
        "healthy": [("shardwise_lease_held", P0, "1x20"), ("shardwise_lease_held", P1, "0 0 0 0 1x20")],
        "labels": dict(P1, severity="warning"),
    },
    {
        "alert": "ShardwiseFenced",
        "at": "25m",
        # Shard 1 fenced at 21m; shard 2's replica started at 21m already fenced once.
        "broken": [("shardwise_fenced_total", P1, "0x20 1x20"), ("shardwise_fenced_total", P2, "_x20 1x20")],
        # A fence long ago; a replica started at 21m at zero (a restart is not a fence).
        "healthy": [("shardwise_fenced_total", P1, "0x5 1x40"), ("shardwise_fenced_total", P2, "_x20 0x20")],
        "labels": [dict(P1, severity="warning"), dict(P2, severity="warning")],
    },
    {
        "alert": "ShardwisePlannerFailing",
        "at": "20m",
        "broken": [
            ("shardwise_planner_runs_total", dict(P0, strategy="sticky-balanced", result="error"), "0+1x30"),
            ("shardwise_planner_runs_total", dict(P0, strategy="sticky-balanced", result="success"), "0+2x30"),
        ],
        "healthy": [
            ("shardwise_planner_runs_total", dict(P0, strategy="sticky-balanced", result="error"), "5x30"),
            ("shardwise_planner_runs_total", dict(P0, strategy="sticky-balanced", result="success"), "0+2x30"),
        ],
        "labels": {"result": "error", "severity": "critical"},
    },
    {
        "alert": "ShardwiseReconcileErrors",
        "at": "25m",
        # 3 errors in 13 reconciles; skipped ones (many) do not dilute the ratio.
        "broken": [
            ("shardwise_reconciles_total", dict(P0, kind="app", result="error"), "0+3x30"),
            ("shardwise_reconciles_total", dict(P0, kind="app", result="success"), "0+10x30"),
            ("shardwise_reconciles_total", dict(P0, kind="app", result="skipped"), "0+100x30"),
        ],
        "healthy": [
            ("shardwise_reconciles_total", dict(P0, kind="app", result="error"), "0+1x30"),
            ("shardwise_reconciles_total", dict(P0, kind="app", result="success"), "0+20x30"),
        ],
        "labels": {"shard": "0", "severity": "warning"},
    },
    {
        "alert": "ShardwiseQueueBacklog",
        "at": "25m",
        "broken": [
            ("shardwise_queue_depth", dict(P1, kind="app"), "60x30"),
            ("shardwise_queue_depth", dict(P1, kind="cluster"), "50x30"),
        ],
        "healthy": [
            ("shardwise_queue_depth", dict(P1, kind="app"), "60x30"),
            ("shardwise_queue_depth", dict(P1, kind="cluster"), "30x30"),
        ],
        "labels": {"shard": "1", "severity": "warning"},
    },
    {
        "alert": "ShardwiseSlowReconciles",
        "at": "25m",
        # Every reconcile between 10.24 s and 20.48 s, or every one under 5.12 s.
        "broken": [
            ("shardwise_reconcile_duration_seconds_bucket", dict(P0, kind="app", le=le), "0x30" if i < 2 else "0+10x30")
            for i, le in enumerate(BUCKETS)
        ],
        "healthy": [
            ("shardwise_reconcile_duration_seconds_bucket", dict(P0, kind="app", le=le), "0+10x30") for le in BUCKETS
        ],
        "labels": {"shard": "0", "severity": "warning"},
    },
    {
        "alert": "ShardwiseRequestsRefused",
        "at": "20m",
        "broken": [
            ("shardwise_api_requests_total", dict(P0, target="control-plane", verb="patch", code="403"), "0+1x30"),
            ("shardwise_api_requests_total", dict(P0, target="control-plane", verb="patch", code="200"), "0+5x30"),
        ],
        "healthy": [
            ("shardwise_api_requests_total", dict(P0, target="control-plane", verb="patch", code="403"), "3x30"),
            ("shardwise_api_requests_total", dict(P0, target="destination", verb="get", code="404"), "0+1x30"),
            ("shardwise_api_requests_total", dict(P0, target="control-plane", verb="patch", code="200"), "0+5x30"),
        ],
        "labels": {"pod": "shardwise-0", "target": "control-plane", "code": "403", "severity": "warning"},
    },
    {
        "alert": "ShardwiseImbalanced",
        "at": "40m",
        "broken": LEADER + [("shardwise_assignment_balance", {"pod": "shardwise-0"}, "1.8x50")],
        "healthy": LEADER
        + [
            ("shardwise_assignment_balance", {"pod": "shardwise-0"}, "1.02x50"),
            ("shardwise_assignment_balance", {"pod": "shardwise-1"}, "3x50"),
        ],
        "labels": {"pod": "shardwise-0", "severity": "info"},
    },
    {
        "alert": "ShardwiseManyCacheCopies",
        "at": "70m",
        # 7 extra caches over 3 live shards, or 6.
        "broken": LEADER
        + [
            ("shardwise_cache_copies", {"pod": "shardwise-0"}, "7x80"),
            ("shardwise_members", {"pod": "shardwise-0", "state": "live"}, "3x80"),
        ],
        "healthy": LEADER
        + [
            ("shardwise_cache_copies", {"pod": "shardwise-0"}, "6x80"),
            ("shardwise_members", {"pod": "shardwise-0", "state": "live"}, "3x80"),
            ("shardwise_cache_copies", {"pod": "shardwise-1"}, "9x80"),
        ],
        "labels": {"pod": "shardwise-0", "severity": "info"},
    },
]


def series(metric: str, labels: dict[str, str], namespace: str, values: str) -> dict[str, str]:
    matchers = ",".join(f'{k}="{v}"' for k, v in sorted(dict(labels, namespace=namespace).items()))
    return {"series": f"{metric}{{{matchers}}}", "values": values}


def promtool_tests(namespace: str) -> dict[str, Any]:
    tests = []
    for case in ALERT_TESTS:
        expected = case["labels"] if isinstance(case["labels"], list) else [case["labels"]]
        for kind in ("broken", "healthy"):
            inputs = [series(m, labels, namespace, v) for m, labels, v in case[kind]]
            if kind == "broken":
                inputs += [series(m, labels, "elsewhere", v) for m, labels, v in case[kind]]
            tests.append(
                {
                    "name": f"{case['alert']} {kind}",
                    "interval": "1m",
                    "input_series": inputs,
                    "alert_rule_test": [
                        {
                            "eval_time": case["at"],
                            "alertname": case["alert"],
                            "exp_alerts": [
                                {"exp_labels": dict(labels, namespace=namespace)} for labels in expected
                            ]
                            if kind == "broken"
                            else [],
                        }
                    ],
                }
            )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def check_alerts(f: Failures, rule: dict[str, Any], namespace: str) -> str:
    """The default PrometheusRule against the docs, the controller's metrics and promtool.
    Returns what promtool did."""
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    documented = docs_alerts()
    f.check(
        sorted(rules) == sorted(documented),
        f"alerts: chart {sorted(rules)}, docs/operations.md {sorted(documented)}",
    )
    for name in sorted(rules.keys() & documented.keys()):
        r, d = rules[name], documented[name]
        f.check(
            unscoped(r["expr"], namespace) == d["expr"],
            f"alert {name}: the chart's expression differs from docs/operations.md:\n"
            f"    chart: {unscoped(r['expr'], namespace)}\n    docs:  {d['expr']}",
        )
        f.check(
            (r["for"], r["labels"]["severity"]) == (d["for"], d["severity"]),
            f"alert {name}: for/severity {r['for']}/{r['labels']['severity']}, docs {d['for']}/{d['severity']}",
        )
    exposed = exposed_metrics()
    for name, r in sorted(rules.items()):
        for metric in sorted(set(re.findall(r"\bshardwise_[a-z_]+\b", r["expr"])) - exposed):
            f.check(False, f"alert {name}: the controller exposes no metric {metric}")
    f.check(
        sorted(c["alert"] for c in ALERT_TESTS) == sorted(rules),
        f"alerts without a promtool unit test: {sorted(set(rules) - {c['alert'] for c in ALERT_TESTS})}",
    )

    promtool = shutil.which("promtool")
    if not f.check(
        promtool is not None, "promtool not found (Debian's prometheus package): run scripts/prerequisites.sh"
    ):
        return "promtool not found"
    with tempfile.TemporaryDirectory() as tmp:
        rules_file = Path(tmp) / "rules.yaml"
        rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
        check = subprocess.run([promtool, "check", "rules", rules_file], capture_output=True, text=True)
        f.check(check.returncode == 0, f"promtool check rules:\n{check.stdout}{check.stderr}")
        # The unit tests compare labels; annotations (checked above as templates) are left out.
        bare = [
            {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
            for g in rule["spec"]["groups"]
        ]
        rules_file.write_text(yaml.safe_dump({"groups": bare}, sort_keys=False))
        tests_file = Path(tmp) / "tests.yaml"
        tests_file.write_text(yaml.safe_dump(promtool_tests(namespace), sort_keys=False))
        test = subprocess.run([promtool, "test", "rules", tests_file], capture_output=True, text=True)
        f.check(test.returncode == 0, f"promtool test rules:\n{test.stdout}{test.stderr}")
    return f"promtool check rules, and {2 * len(ALERT_TESTS)} unit tests (promtool test rules)"


def check_dashboard_uids(f: Failures, chart: helm.Chart) -> int:
    """Releases that could collide in one Grafana get different uids: same name in two
    namespaces, names that join to the same text, names longer than a uid, and a release name
    with a character a uid may not hold."""
    releases: list[tuple[str, str, dict[str, Any]]] = [
        ("shardwise", "shardwise", {}),
        ("shardwise", "staging", {}),
        ("prod-a", "x", {}),
        ("prod", "a-x", {}),
        # Helm allows dots in release names, Grafana not in uids (the fullname would be no
        # valid Service name).
        ("prod.a", "x", {"fullnameOverride": "prod-a"}),
        ("fleet-controller-with-a-very-long-release-name", "platform-fleet-production-europe", {}),
        ("fleet-controller-with-a-very-long-release-name", "platform-fleet-production-europe-2", {}),
    ]
    uids = {}
    for release, namespace, overrides in releases:
        objects = render(chart, merge({"dashboards": {"enabled": True}}, overrides), release, namespace)
        uid = json.loads(one(objects, "ConfigMap")["data"]["shardwise.json"])["uid"]
        f.check(
            re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid) is not None,
            f"dashboard uid {uid!r} of {namespace}/{release} is not a valid Grafana uid",
        )
        uids[(release, namespace)] = uid
    f.check(len(set(uids.values())) == len(uids), f"dashboard uids collide: {uids}")
    return len(uids)


def check_chart_metadata(f: Failures) -> None:
    """Chart.yaml's metadata for Artifact Hub: the CRDs it lists are deploy/crds.yaml's, the icon
    is the one committed, and the README is what scripts/chart_readme.py makes of values.yaml."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    listed = yaml.safe_load(chart.get("annotations", {}).get("artifacthub.io/crds", "[]"))
    crds = [d for d in yaml.safe_load_all((ROOT / "deploy" / "crds.yaml").read_text()) if d]
    f.check(
        sorted((c["kind"], c["name"], c["version"]) for c in listed)
        == sorted(
            (d["spec"]["names"]["kind"], d["metadata"]["name"], v["name"])
            for d in crds
            for v in d["spec"]["versions"]
            if v.get("storage")
        ),
        "Chart.yaml annotation artifacthub.io/crds does not list the CRDs of deploy/crds.yaml",
    )
    icon = chart.get("icon", "")
    f.check(
        icon.endswith("/charts/shardwise/icon.svg") and (CHART / "icon.svg").is_file(),
        f"Chart.yaml icon {icon!r} is not the committed charts/shardwise/icon.svg",
    )
    f.check(bool(chart.get("maintainers")) and bool(chart.get("sources")), "Chart.yaml without maintainers or sources")
    # The generator on a sample of what helm-docs reads: continued lines, a type and a default
    # named by hand, a described parent covering its keys, a plain comment describing nothing.
    sample = (
        "# -- The count,\n# of things.\ncount: 3\n# -- (int) Empty: computed.\n# @default -- 35\ngrace: null\n"
        "# -- All of it.\nwhole:\n  part: 1\nplain:\n  # not a description\n  key: x\n"
    )
    f.check(
        [(r.key, r.type, r.default, r.description) for r in chart_readme.rows(sample)]
        == [
            ("count", "int", "`3`", "The count, of things."),
            ("grace", "int", "35", "Empty: computed."),
            ("whole", "object", '`{"part":1}`', "All of it."),
        ]
        and chart_readme.undocumented(sample) == ["plain.key"],
        f"scripts/chart_readme.py reads the sample values wrongly: {chart_readme.rows(sample)}",
    )
    values_text = (CHART / "values.yaml").read_text()
    missing = chart_readme.undocumented(values_text)
    f.check(not missing, f"values without a `# --` description: {', '.join(missing)}")
    f.check(
        (CHART / "README.md").read_text() == chart_readme.render(),
        f"charts/shardwise/README.md is stale: run `{chart_readme.REGENERATE}`",
    )


def check_test_script(f: Failures, chart: helm.Chart) -> str:
    """The `helm test` Pod's script, run here as in its busybox image (busybox's sh, and its
    applets alone on the PATH) against replicas served by a local HTTP server: it passes when
    all answer ready, waits for a late one, and fails naming one that never is. Rendered with a
    podSecurityContext that sets no user, which the test Pod must not need. Returns what was done."""
    objects = render(
        chart,
        {
            "replicas": 2,
            "tests": {"timeoutSeconds": 3},
            "podSecurityContext": {"runAsUser": None, "runAsGroup": None},
        },
        "shardwise",
        "shardwise",
    )
    pod = one(objects, "Pod")
    container = pod["spec"]["containers"][0]
    f.check(
        "runAsUser" not in pod["spec"].get("securityContext", {})
        and container["securityContext"].get("runAsUser", 0) != 0,
        "helm test Pod: without podSecurityContext.runAsUser it runs as busybox's root, which "
        "runAsNonRoot makes the kubelet refuse",
    )
    script = container["args"][0]
    shellcheck = Path(sysconfig.get_path("scripts")) / "shellcheck"
    lint = subprocess.run([shellcheck, "-s", "sh", "-"], input=script, capture_output=True, text=True)
    f.check(lint.returncode == 0, f"shellcheck of the helm test script:\n{lint.stdout}{lint.stderr}")
    busybox = shutil.which("busybox")
    if not f.check(
        busybox is not None, "helm test script not run: busybox not found; run scripts/prerequisites.sh"
    ):
        return "shellcheck of its script; busybox not found"
    f.check(container["command"] == ["sh", "-c"], f"helm test Pod command {container['command']}")

    # The image's /bin: a link to busybox per applet, and nothing else, so that `wget`, `date`
    # and `sleep` are busybox's (its sh runs commands from the PATH, not its own applets).
    applets = subprocess.run([busybox, "--list"], check=True, capture_output=True, text=True).stdout.split()
    bin_dir = tempfile.TemporaryDirectory()
    for applet in applets:
        (Path(bin_dir.name) / applet).symlink_to(busybox)

    ready_at: dict[str, float] = {}

    class Replica(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            ready = time.monotonic() >= ready_at.get(self.path, float("inf"))
            self.send_response(200 if ready else 503)
            self.end_headers()
            self.wfile.write(b"ready" if ready else b"not ready")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    paths = [f"/replica-{i}/readyz" for i in range(2)]
    urls = [f"http://127.0.0.1:{server.server_address[1]}{path}" for path in paths]
    try:
        for case, delays, passes in (
            ("both ready", [0, 0], True),
            ("one ready after 1s", [0, 1], True),
            ("one never ready", [0, None], False),
        ):
            now = time.monotonic()
            ready_at.clear()
            ready_at.update({path: now + d for path, d in zip(paths, delays) if d is not None})
            run = subprocess.run(
                [busybox, *container["command"], script, "readiness", *urls],
                capture_output=True,
                text=True,
                timeout=30,
                env={"PATH": bin_dir.name},
            )
            f.check(
                (run.returncode == 0) == passes,
                f"helm test script, {case}: exit {run.returncode}, output {run.stdout}{run.stderr}",
            )
            if not passes:
                f.check(
                    f"not ready: {urls[1]}" in run.stdout, f"helm test script does not name the replica: {run.stdout}"
                )
    finally:
        server.shutdown()
        bin_dir.cleanup()
    return "shellcheck of its script, run by busybox against ready, late and never-ready replicas"


def check_rbac(f: Failures, objects: list[dict[str, Any]]) -> None:
    """The default release's RBAC is deploy/rbac.yaml, which the end-to-end tests enforce."""

    def essence(documents: Any) -> str:
        kept = []
        for o in sorted(
            (
                d
                for d in documents
                if d and d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
            ),
            key=lambda d: (d["kind"], d["metadata"]["name"]),
        ):
            o = dict(o, metadata={k: v for k, v in o["metadata"].items() if k in ("name", "namespace")})
            kept.append(o)
        return yaml.safe_dump_all(kept, sort_keys=True)

    chart = essence(objects)
    deploy = essence(yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()))
    diff = difflib.unified_diff(
        deploy.splitlines(),
        chart.splitlines(),
        "deploy/rbac.yaml",
        "chart (release shardwise, namespace shardwise)",
        lineterm="",
    )
    f.check(
        chart == deploy,
        "the chart's RBAC differs from deploy/rbac.yaml (labels aside):\n    " + "\n    ".join(diff),
    )


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


def expect_refused(f: Failures, chart: helm.Chart, values: dict[str, Any], text: str) -> None:
    try:
        chart.validate_schema(values)
        render(chart, values, "shardwise", "shardwise")
    except helm.HelmError as e:
        f.check(text in str(e), f"values {values} refused, but the message does not name {text!r}: {e}")
        return
    f.check(False, f"values {values} were accepted")


def main() -> int:
    f = Failures()

    def report(summary: str, before: int) -> None:
        print(f"{'ok    ' if len(f.items) == before else 'FAILED'} {summary}")

    flags = controller_flags()
    options = balance_options()
    docs_rules = docs_balancer_rules()
    with helm.Chart.load(CHART) as chart:
        defaults = chart.values
        print(f"chart {chart.name} {chart.version}, rendered by Helm SDK {helm.helm_sdk_version()}")

        # Lint, as `helm lint --strict`, at the oldest and newest supported versions.
        before, infos = len(f.items), set()
        for values in (None, EVERYTHING):
            for version in KUBE_VERSIONS:
                result = helm.lint(CHART, values, strict=True, kube_version=f"v{version}")
                for m in result["messages"]:
                    if f.check(
                        m["severity"] < 2,
                        f"lint ({'defaults' if values is None else 'everything on'}, "
                        f"Kubernetes {version}): {m['path']}: {m['error']}",
                    ):
                        infos.add(m["error"])
                for e in result["errors"]:
                    f.check(False, f"lint: {e}")
        report(
            f"lint --strict, defaults and everything-on values, Kubernetes {' and '.join(KUBE_VERSIONS)} "
            f"(info only: {'; '.join(sorted(infos)) or 'none'})",
            before,
        )

        releases: list[tuple[str, str, dict[str, Any]]] = [
            ("shardwise", "shardwise", {}),
            ("prod", "fleet", EVERYTHING),
            (
                "x",
                "shardwise",
                {
                    "fullnameOverride": "fleet-controller",
                    "serviceAccount": {"create": False, "name": "fleet"},
                    "rbac": {"create": False},
                    "podDisruptionBudget": {"enabled": False},
                    "metrics": {"secure": False, "serviceMonitor": {"enabled": True, "interval": "15s"}},
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": "fleet", "operator": "Exists"}]}
                                ]
                            }
                        }
                    },
                    "startupProbe": {},
                    "tests": {"enabled": False},
                    "crds": {"upgrade": True},
                    "prometheusRule": {"enabled": True},
                    "dashboards": {"enabled": True},
                    "argocdBalancer": {"enabled": True},
                },
            ),
            ("argocd", "gitops", BALANCER_ONLY),
            ("sized", "shardwise", SIZED),
            # NOTES.txt's other wording: the planner scales up only after sizing.scaleUpWindow.
            ("windowed", "shardwise", {"sizing": {"autoscale": True, "scaleUpWindow": "2m"}}),
            (
                "spread",
                "shardwise",
                {
                    "podAntiAffinity": "none",
                    "autoscaling": {"enabled": True},
                    "prometheusRule": {
                        "enabled": True,
                        "alerts": {name: {"enabled": False} for name in defaults["prometheusRule"]["alerts"]},
                    },
                },
            ),
        ]
        rendered: dict[str, list[dict[str, Any]]] = {}
        for release, namespace, overrides in releases:
            before = len(f.items)
            chart.validate_schema(overrides)
            objects, notes = render_with_notes(chart, overrides, release, namespace)
            values = merge(defaults, overrides)
            where = f"release {release!r}"
            controller = [o for o in objects if not is_balancer(o)]
            if values["controller"]["enabled"]:
                check_release(f, controller, values, release, namespace, flags)
            else:
                check_no_controller(f, controller, where)
            check_balancer(f, objects, values, namespace, options, docs_rules, where)
            check_notes(f, notes, objects, values, where)
            kinds = sorted({o["kind"] for o in objects})
            report(
                f"render release {release!r} in {namespace!r}: {len(objects)} objects ({', '.join(kinds)})",
                before,
            )
            rendered[f"release {release!r}"] = objects
        rendered["crds/"] = [doc for crd in chart.crds for doc in yaml.safe_load_all(crd["data"]) if doc]
        before = len(f.items)
        validated = sum(validate(f, objects, where) for where, objects in rendered.items())
        report(
            f"validate {validated} objects (CRDs included) strictly against the schemas of Kubernetes "
            f"{' and '.join(KUBE_VERSIONS)} (ServiceMonitor, PodMonitor, PrometheusRule: no schema, checked by assertions)",
            before,
        )

        before = len(f.items)
        rule = one(rendered["release 'x'"], "PrometheusRule")
        done = check_alerts(f, rule, "shardwise")
        report(
            f"alerts: the PrometheusRule of release 'x' is docs/operations.md's table, on metrics the "
            f"controller registers; {done}",
            before,
        )

        before = len(f.items)
        done = check_test_script(f, chart)
        report(f"helm test: {done}", before)

        before = len(f.items)
        count = check_dashboard_uids(f, chart)
        report(f"dashboard: {count} releases that could collide in one Grafana get {count} valid uids", before)

        before = len(f.items)
        for values, text in INVALID:
            expect_refused(f, chart, values, text)
        report(
            f"values schema: {len(releases)} value sets accepted, {len(INVALID)} invalid ones refused with a message",
            before,
        )

    before = len(f.items)
    default_objects = rendered["release 'shardwise'"]
    check_rbac(f, default_objects)
    report("rbac: the ServiceAccount, roles and bindings of release 'shardwise' are deploy/rbac.yaml", before)

    # Least privilege: sizing.autoscale adds the scale rule to the default Role, and nothing else.
    before = len(f.items)
    default_rules = one(default_objects, "Role")["rules"]
    sized_rules = one(rendered["release 'sized'"], "Role")["rules"]
    f.check(
        sized_rules.count(SCALE_RULE) == 1 and [r for r in sized_rules if r != SCALE_RULE] == default_rules,
        f"rbac: the Role of release 'sized' is not the default Role plus {SCALE_RULE}: {sized_rules}",
    )
    report("rbac: sizing.autoscale adds exactly get and update on statefulsets/scale to the Role", before)

    before = len(f.items)
    f.check(
        (CHART / "crds" / "crds.yaml").read_bytes() == (ROOT / "deploy" / "crds.yaml").read_bytes(),
        "charts/shardwise/crds/crds.yaml differs from deploy/crds.yaml: run `make chart-crds`",
    )
    report("crds: charts/shardwise/crds/crds.yaml is deploy/crds.yaml", before)

    before = len(f.items)
    check_chart_metadata(f)
    report("metadata: Artifact Hub CRDs and icon; README.md generated from values.yaml, every value described", before)

    # The chart's defaults are the controller's, except where it says otherwise.
    before = len(f.items)
    default_env = env_of(one(default_objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0])
    for variable, default in flags.items():
        if default is not None:
            wanted = DIFFERENT_DEFAULTS.get(variable, default)
            f.check(
                default_env.get(variable) == wanted,
                f"default of {variable}: chart {default_env.get(variable)!r}, controller {default!r}",
            )
    report(
        f"controller: {len(flags)} settings from --help, each set from a value; defaults equal except "
        f"{', '.join(f'{k}={v}' for k, v in DIFFERENT_DEFAULTS.items())}",
        before,
    )

    # `make e2e-kind` cannot run here; its script is at least linted.
    before = len(f.items)
    shellcheck = Path(sysconfig.get_path("scripts")) / "shellcheck"
    lint = subprocess.run([shellcheck, KIND_SCRIPT], capture_output=True, text=True)
    f.check(lint.returncode == 0, f"shellcheck {KIND_SCRIPT.relative_to(ROOT)}:\n{lint.stdout}{lint.stderr}")
    report(f"shellcheck {KIND_SCRIPT.relative_to(ROOT)}", before)

    if f.items:
        print(f"\n{len(f.items)} chart check(s) failed:", file=sys.stderr)
        for item in f.items:
            print(f"  - {item}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
