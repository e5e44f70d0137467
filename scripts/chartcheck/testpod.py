"""`helm test`: the hook Pod each release renders, and its script run by busybox, as in its
image, against replicas served locally."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm

from .common import Failures, one, render


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
