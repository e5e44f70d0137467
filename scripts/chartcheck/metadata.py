"""The chart beyond a single release: dashboard uids that stay apart across releases, and
Chart.yaml's Artifact Hub metadata with the README generated from values.yaml."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import yaml

import chart_readme

from .common import CHART, ROOT, Failures, merge, one, render


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
