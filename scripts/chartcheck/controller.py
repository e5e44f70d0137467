"""The controller's part of a release: its StatefulSet, Service, variables, metrics, RBAC,
scaling, monitors, dashboard, pod options and CRD templates, or nothing of it when it is off;
and the default release's RBAC, which must be deploy/rbac.yaml."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

import yaml

from .alerts import check_prometheus_rule
from .common import CHART, ROOT, Failures, env_of, one, seconds
from .releases import SCALE_RULE
from .testpod import check_test_pod


def check_no_controller(f: Failures, objects: list[dict[str, Any]], where: str) -> None:
    """`controller.enabled: false`: none of the controller's objects, only CRDs and the dashboard."""
    left = sorted(
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] not in ("CustomResourceDefinition", "ConfigMap")
    )
    f.check(not left, f"{where}: controller.enabled is false, yet the controller's {left} are rendered")


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
