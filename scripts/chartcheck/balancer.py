"""The Argo CD balancer (`argocdBalancer`): its Deployment's flags and environment, its pods out
of the controller's selectors, its monitors, and its roles exactly the Role of docs/argocd.md."""

from __future__ import annotations

import re
from typing import Any

import yaml

from .common import ROOT, Failures, env_of, one


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


def docs_balancer_rules(name: str = "shardwise-argocd-balancer") -> set[Rule]:
    """The rules of the Role `name` that docs/argocd.md gives."""
    text = (ROOT / "docs" / "argocd.md").read_text()
    for block in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S):
        role = yaml.safe_load(block)
        if isinstance(role, dict) and role.get("kind") == "Role":
            if role["metadata"]["name"] == name:
                return rule_set(role["rules"])
    raise AssertionError(f"docs/argocd.md has no yaml block of the Role {name}")


def is_balancer(o: dict[str, Any]) -> bool:
    return o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "argocd-balancer"


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
        container["command"] == ["/usr/local/bin/shardwise-balancer"],
        f"{where}: the balancer runs {container['command']}, not shardwise-balancer",
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
    f.check(given <= flags, f"{where}: flags `shardwise-balancer` does not have: {sorted(given - flags)}")
    expected = [
        f"--namespace={b['namespace']}",
        f"--statefulset={b['controller']}",
        *([f"--app-namespaces={','.join(b['applicationNamespaces'])}"] if b["applicationNamespaces"] else []),
        f"--load={b['load']}",
        f"--load-window={b['loadWindow']}",
        f"--load-memory-weight={b['loadMemoryWeight']}",
        f"--controller-metrics-port={b['controllerMetricsPort']}",
        f"--interval={b['interval']}",
        f"--down-grace={b['downGrace']}",
        f"--max-extra-moves={b['maxExtraMoves']}",
        f"--target-balance={b['targetBalance']}",
        f"--load-trigger={b['loadTrigger']}",
        f"--min-move-interval={b['minMoveInterval']}",
        f"--hourly-move-budget={b['hourlyMoveBudget']}",
        f"--sync-wait={b['syncWait']}",
        *(["--manage-replicas"] if b["manageReplicas"] else []),
        f"--load-per-replica={b['loadPerReplica']}",
        f"--min-replicas={b['minReplicas']}",
        f"--max-replicas={b['maxReplicas']}",
        f"--scale-down-window={b['scaleDownWindow']}",
        f"--metrics-addr={c['listenAddress']}:{c['metricsPort']}",
        f"--health-addr={c['listenAddress']}:{c['healthPort']}",
        f"--refresh-moved-apps={str(b['refreshMovedApps']).lower()}",
        *(["--dry-run"] if b["dryRun"] else []),
    ]
    f.check(args == expected, f"{where}: balancer arguments {args}, expected {expected}")
    f.check(
        env
        == {
            "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
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
        # docs/argocd.md's Role refreshes moved Applications; without that, no patch on them.
        refresh = {("argoproj.io", "applications", "patch")}
        wanted = docs_rules if b["refreshMovedApps"] else docs_rules - refresh
        # docs/argocd.md's second Role: --manage-replicas writes the controller's StatefulSet.
        if b["manageReplicas"]:
            wanted = wanted | docs_balancer_rules("shardwise-argocd-balancer-replicas")
        f.check(
            granted == wanted,
            f"{where}: the balancer's roles grant {sorted(granted - wanted)} beyond docs/argocd.md's Role "
            f"and miss {sorted(wanted - granted)}",
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
        # The Lease is the installation's, in Argo CD's namespace whatever the release is called.
        lease = {r for r in docs_rules if r[:2] == ("coordination.k8s.io", "leases")}
        f.check(
            by_namespace.get(b["namespace"], set()) >= lease,
            f"{where}: no Role for the Lease in Argo CD's namespace {b['namespace']}",
        )
        f.check(
            lease.isdisjoint(by_namespace.get(namespace, set())) or b["namespace"] == namespace,
            f"{where}: a Lease rule in the release namespace {namespace}, where no Lease of the balancer is",
        )
        patterns = [n for n in b["applicationNamespaces"] if re.search(r"[*?]", n)]
        cluster_roles = [o for o in roles if o["kind"] == "ClusterRole"]
        list_apps = {("argoproj.io", "applications", "list")} | (refresh if b["refreshMovedApps"] else set())
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
                set(by_namespace) == literal | {b["namespace"]},
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
