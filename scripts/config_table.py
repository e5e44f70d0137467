#!/usr/bin/env python3
"""Generates the configuration table of docs/architecture.md from `shardwise-controller --help`
(built with cargo), so that the table cannot drift from the flags: one row per flag with its
environment variable, its default and the first paragraph of its help.

    scripts/config_table.py          rewrite the table in docs/architecture.md
    scripts/config_table.py --check  exit 1 if the table is not what the flags give

`make config-table` runs the first; `make config-table-check` (part of `make test`) the second.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from chartcheck.flags import controller_help

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- Generated from `shardwise-controller --help` by scripts/config_table.py; do not edit. -->"
END = "<!-- End of the generated table. -->"


@dataclass
class Flag:
    name: str
    required: bool
    env: str | None
    default: str | None
    help: str


def flags(text: str) -> list[Flag]:
    """Every long flag of clap's long help, in its order, `--help` and `--version` left out."""
    usage = re.search(r"^Usage: .*$", text, re.M)
    required = set(re.findall(r"(--[a-z][a-z-]*) <", usage.group(0))) if usage else set()
    options = text.split("\nOptions:\n", 1)[1]
    found = []
    for block in re.split(r"\n(?=\s{2,6}(?:-[a-zA-Z], )?--[a-z])", options):
        head = re.match(r"\s*(?:-[a-zA-Z], )?(--[a-z][a-z-]*)", block)
        if not head or head.group(1) in ("--help", "--version"):
            continue
        body = block.split("\n", 1)[1] if "\n" in block else ""
        lines = [line.strip() for line in body.splitlines()]
        paragraph = []
        for line in lines:
            if line == "Possible values:" or line.startswith("["):
                break
            if not line:
                if paragraph:
                    break
                continue
            paragraph.append(line)
        if not paragraph and "Possible values:" in body:
            # A flag whose help is its values: name them.
            values = re.findall(r"^\s*- ([a-z-]+):\s*(.*)$", body, re.M)
            paragraph = ["; ".join(f"`{v}`: {d}" for v, d in values)]
        env = re.search(r"\[env: ([A-Z_]+)=", block)
        default = re.search(r"\[default: ([^\]]*)\]", block)
        found.append(
            Flag(
                name=head.group(1),
                required=head.group(1) in required,
                env=env.group(1) if env else None,
                default=default.group(1) if default else None,
                help=" ".join(paragraph),
            )
        )
    if len(found) < 10 or not any(f.name == "--namespace" for f in found):
        raise SystemExit("could not read the flags of `shardwise-controller --help`: update config_table.py")
    return found


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(found: list[Flag]) -> str:
    rows = ["| flag | environment | default | what it sets |", "|---|---|---|---|"]
    for f in found:
        env = f"`{f.env}`" if f.env else ""
        default = "required" if f.required else f"`{f.default}`" if f.default not in (None, "") else "none"
        rows.append(f"| `{f.name}` | {env} | {default} | {cell(f.help)} |")
    return "\n".join(rows)


def rewritten(doc: str, generated: str) -> str:
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC}: no generated table between {BEGIN!r} and {END!r}")
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{generated}\n{END}{after}"


def main() -> None:
    doc = DOC.read_text()
    wanted = rewritten(doc, table(flags(controller_help())))
    if "--check" in sys.argv[1:]:
        if wanted != doc:
            sys.exit(
                f"{DOC.relative_to(ROOT)}: the configuration table is not what `shardwise-controller --help` gives: "
                "run `make config-table`"
            )
        return
    DOC.write_text(wanted)


if __name__ == "__main__":
    main()
