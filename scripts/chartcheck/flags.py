"""The settings of the controller and of `shardwise-balancer`, read from their own --help (built
with cargo), which the chart must set from its values."""

from __future__ import annotations

import os
import re
import subprocess

from .common import ROOT


def controller_help() -> str:
    """`shardwise-controller --help`, built with cargo (`$CARGO`) and the committed lockfile."""
    cargo = os.environ.get("CARGO", "cargo")
    return subprocess.run(
        [cargo, "run", "--quiet", "--locked", "-p", "shardwise-controller", "--", "--help"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


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
    cargo = os.environ.get("CARGO", "cargo")
    help_text = subprocess.run(
        [cargo, "run", "--quiet", "-p", "shardwise-balancer", "--bin", "shardwise-balancer", "--", "--help"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    flags = set(re.findall(r"^\s*(?:-[a-zA-Z], )?(--[a-z][a-z-]*)", help_text, re.M))
    env = set(re.findall(r"\[env: ([A-Z_]+)=", help_text))
    if not {"--namespace", "--interval"} <= flags or "POD_NAME" not in env:
        raise AssertionError("could not read the flags of `shardwise-balancer --help`: update balance_options()")
    return flags, env
