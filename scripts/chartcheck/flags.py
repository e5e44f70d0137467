"""The settings of the controller and of `shardwise-balancer`, read from their own --help, which
the chart must set from its values.

The binaries are built with cargo (`$CARGO run -p ...`), unless `$SHARDWISE_BINARIES` names a
directory that holds them: `make test` points it at the workspace's test build, which compiled
both, so that CI does not compile the two packages a second time with their own features (a
package built alone resolves its dependencies' features apart from the workspace's)."""

from __future__ import annotations

import os
import re
import subprocess

from .common import ROOT


def _help(package: str, binary: str) -> str:
    """`binary --help`, from `$SHARDWISE_BINARIES` or built with cargo and the committed lockfile."""
    built = os.environ.get("SHARDWISE_BINARIES")
    if built:
        command = [os.path.join(built, binary), "--help"]
    else:
        cargo = os.environ.get("CARGO", "cargo")
        command = [cargo, "run", "--quiet", "--locked", "-p", package, "--bin", binary, "--", "--help"]
    return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def controller_help() -> str:
    """`shardwise-controller --help`."""
    return _help("shardwise-controller", "shardwise-controller")


def controller_flags() -> dict[str, str | None]:
    """The controller's environment variables and their defaults, from its own --help."""
    help_text = controller_help()
    flags: dict[str, str | None] = {}
    for block in re.split(r"\n(?=\s*(?:-[a-zA-Z], )?--[a-z])", help_text):
        env = re.search(r"\[env: ([A-Z_]+)=", block)
        if env:
            default = re.search(r"\[default: ([^\]]*)\]", block)
            flags[env.group(1)] = default.group(1) if default else None
    return flags


def balance_options() -> tuple[set[str], set[str]]:
    """The long flags and environment variables of `shardwise-balancer`, from its own --help."""
    help_text = _help("shardwise-balancer", "shardwise-balancer")
    flags = set(re.findall(r"^\s*(?:-[a-zA-Z], )?(--[a-z][a-z-]*)", help_text, re.M))
    env = set(re.findall(r"\[env: ([A-Z_]+)=", help_text))
    if not {"--namespace", "--interval"} <= flags or "POD_NAME" not in env:
        raise AssertionError("could not read the flags of `shardwise-balancer --help`: update balance_options()")
    return flags, env
