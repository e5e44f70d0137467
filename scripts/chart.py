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
(`argocdBalancer`): each value on its flag of `shardwise-balancer --help`, its pods out of the
controller's selectors, and its roles exactly the Role of docs/argocd.md. Also checks that
charts/shardwise/README.md is what scripts/chart_readme.py generates, and lints e2e/kind/run.sh
(`make e2e-kind` needs Docker) with shellcheck. promtool and busybox come from
scripts/prerequisites.sh; without them the checks fail.

Run by `make chart` (part of `make test`); the pinned packages are in scripts/requirements.txt.
Exits non-zero and lists every failure when a check fails.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from chartcheck.alerts import check_alerts
from chartcheck.balancer import check_balancer, docs_balancer_rules, is_balancer
from chartcheck.common import (
    CHART,
    KIND_SCRIPT,
    KUBE_VERSIONS,
    ROOT,
    Failures,
    env_of,
    merge,
    one,
    render,
    render_with_notes,
    validate,
)
from chartcheck.controller import check_no_controller, check_rbac, check_release
from chartcheck.flags import balance_options, controller_flags
from chartcheck.metadata import check_chart_metadata, check_dashboard_uids
from chartcheck.notes import check_notes
from chartcheck.releases import BALANCER_ONLY, DIFFERENT_DEFAULTS, EVERYTHING, INVALID, SCALE_RULE, SIZED
from chartcheck.testpod import check_test_script


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
