"""The PrometheusRule: its structure and its values in every release, and the default alerts
against docs/operations.md, the metrics the controller registers, and promtool (syntax and unit
tests)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .common import ROOT, Failures


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
    # The Argo CD balancer's own gauges (crates/shardwise-balancer/src/metrics.rs).
    balancer = (ROOT / "crates" / "shardwise-balancer" / "src" / "metrics.rs").read_text()
    gauges = re.findall(r'r\.register\(\s*"([a-z_]+)"', balancer)
    if len(gauges) != balancer.count("r.register(") or "Counter" in balancer or "Histogram" in balancer:
        raise AssertionError("could not read the metric registrations of the balancer: update exposed_metrics()")
    names.update("shardwise_" + g for g in gauges)
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
    {
        "alert": "ShardwiseArgoCdUnreconciled",
        "at": "5m",
        # The leading balancer sees 12 apps unreconciled; a standby's stale view is not read.
        "broken": [
            ("shardwise_planner_leader", {"pod": "balancer-a", "shard": "argocd-balancer"}, "1x10"),
            ("shardwise_argocd_unreconciled_apps", {"pod": "balancer-a"}, "0 12x10"),
        ],
        "healthy": [
            ("shardwise_planner_leader", {"pod": "balancer-a", "shard": "argocd-balancer"}, "1x10"),
            ("shardwise_planner_leader", {"pod": "balancer-b", "shard": "argocd-balancer"}, "0x10"),
            ("shardwise_argocd_unreconciled_apps", {"pod": "balancer-a"}, "0x10"),
            ("shardwise_argocd_unreconciled_apps", {"pod": "balancer-b"}, "12x10"),
        ],
        "labels": {"severity": "critical"},
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
