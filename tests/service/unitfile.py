"""Helpers for the systemd tests: read unit files the way systemd does (repeated keys kept)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_DIR = REPO / "systemd"
UNIT = SYSTEMD_DIR / "sandboxd.service"
EXPOSURE_GOAL = 2.0


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values in order]}}``; continuation lines joined, comments dropped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        logical.append(line)
    for line in logical:
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        section = re.fullmatch(r"\[([^\]]+)\]", stripped)
        if section:
            current = sections.setdefault(section.group(1), {})
            continue
        if current is None or "=" not in stripped:
            raise ValueError(f"not a unit file line: {line!r}")
        key, value = stripped.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def systemd_analyze() -> str:
    """The path of systemd-analyze (part of Debian's `systemd` package)."""
    path = shutil.which("systemd-analyze")
    if path is None:
        raise RuntimeError("systemd-analyze is missing: apt-get install systemd")
    return path


def exposure(unit: Path, *, env: dict[str, str] | None = None) -> tuple[float, str]:
    """``systemd-analyze security --offline=true`` -> (overall exposure, full output)."""
    proc = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    out = proc.stdout + proc.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", out)
    if match is None:
        raise AssertionError(f"no 'Overall exposure level' line (rc={proc.returncode}):\n{out}")
    return float(match.group(1)), out
