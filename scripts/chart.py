#!/usr/bin/env python3
"""Checks the Helm chart charts/shardwise with Helm's own engine (helm-python-sdk: Helm's Go SDK
behind a C ABI, no helm binary needed): lint, the values schema, renders of several releases,
every rendered object and CRD validated against the Kubernetes schemas (kubernetes-validate),
and what the chart promises: the RBAC of deploy/rbac.yaml, the CRDs of deploy/crds.yaml, every
controller flag set from a value, names that match, probes, security context, autoscaling. Also
lints e2e/kind/run.sh (`make e2e-kind` needs Docker) with shellcheck.

Run by `make chart` (part of `make test`); the pinned packages are in scripts/requirements.txt.
Exits non-zero and lists every failure when a check fails.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "shardwise"
KIND_SCRIPT = ROOT / "e2e" / "kind" / "run.sh"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ["1.25.0", "1.37.0"]
# Kinds of the Prometheus operator, for which kubernetes-validate has no schema: checked by the
# assertions below instead (port, selector, namespace).
OPERATOR_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PodMonitor")}
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
}

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


def render(
    chart: helm.Chart, values: dict[str, Any] | None, release: str, namespace: str
) -> list[dict[str, Any]]:
    manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


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
    # audit file when off; nothing is set that the controller does not read.
    chart_env = {k for k in env if k.startswith("SHARDWISE_") or k.startswith("POD_")}
    secure = values["metrics"]["secure"]
    cert_dir = secure and values["metrics"]["certSecret"]
    expected = (
        set(flags)
        - ({"SHARDWISE_AUDIT_FILE"} if not c["auditFile"] else set())
        - ({"SHARDWISE_METRICS_CERT_DIR"} if not cert_dir else set())
    )
    f.check(
        chart_env == expected,
        f"{where}: controller variables differ: chart only {sorted(chart_env - expected)}, "
        f"controller only {sorted(expected - chart_env)}",
    )

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

    hpa = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    if values["autoscaling"]["enabled"]:
        f.check("replicas" not in sts["spec"], f"{where}: spec.replicas set although an HPA owns the count")
        f.check(
            len(hpa) == 1
            and hpa[0]["spec"]["scaleTargetRef"]
            == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
            f"{where}: HPA does not target the StatefulSet",
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
        f.check(
            json.loads(dashboards[0]["data"]["shardwise.json"]) == shipped,
            f"{where}: dashboard differs from the file",
        )
    else:
        f.check(not dashboards, f"{where}: dashboard rendered although disabled")

    if c["auditFile"]:
        mount = container["volumeMounts"][0]["mountPath"]
        f.check(
            c["auditFile"].startswith(mount + "/"),
            f"{where}: audit file {c['auditFile']} not on a writable volume",
        )


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
                },
            ),
        ]
        rendered: dict[str, list[dict[str, Any]]] = {}
        for release, namespace, overrides in releases:
            before = len(f.items)
            chart.validate_schema(overrides)
            objects = render(chart, overrides, release, namespace)
            check_release(f, objects, merge(defaults, overrides), release, namespace, flags)
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
            f"{' and '.join(KUBE_VERSIONS)} (ServiceMonitor, PodMonitor: no schema, checked by assertions)",
            before,
        )

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

    before = len(f.items)
    f.check(
        (CHART / "crds" / "crds.yaml").read_bytes() == (ROOT / "deploy" / "crds.yaml").read_bytes(),
        "charts/shardwise/crds/crds.yaml differs from deploy/crds.yaml: run `make chart-crds`",
    )
    report("crds: charts/shardwise/crds/crds.yaml is deploy/crds.yaml", before)

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
