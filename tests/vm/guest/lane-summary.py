"""The summary lines of one lane of the VM job's test suite (guest/test-suite.sh), from its
pytest run's junit XML: one line per entry (a tests/ directory, or a glob of one directory's
files) with its tests counted and their times summed, then the lane's own line (its wall time
and pytest's status). Columns: dir passed failed errors skipped seconds rc.

    python3 lane-summary.py LANE.xml NAME WALL_SECONDS PYTEST_RC ENTRY...

Exit status 1 when a test was skipped (the job allows none), else 0. Standard library only:
the guest's system python runs it.
"""

from __future__ import annotations

import fnmatch
import sys
import xml.etree.ElementTree as ET

OUTCOMES = ("failure", "error", "skipped")


def entry_of(classname: str, entries: list[str]) -> str | None:
    """The entry a test belongs to, by its junit classname (``tests.<dir>.<module>[.<class>]``)."""
    parts = classname.split(".")
    if len(parts) < 3:
        return None
    path = f"{parts[1]}/{parts[2]}.py"
    for entry in entries:
        if fnmatch.fnmatchcase(path, entry if "/" in entry else f"{entry}/*"):
            return entry
    return None


def summarise(xml: str, name: str, wall: str, rc: int,
              entries: list[str]) -> tuple[list[str], int]:
    """The lines, and how many tests were skipped."""
    rows: dict[str, list[float]] = {e: [0, 0, 0, 0, 0.0] for e in entries}
    try:
        cases = list(ET.parse(xml).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        unread = [f"{e}\t?\t?\t?\t?\t?\t?" for e in entries]
        return [*unread, f"{name}\t?\t?\t?\t?\t{wall}\t{rc or 1}"], 0
    for case in cases:
        row = rows.setdefault(entry_of(case.get("classname") or "", entries) or "(other)",
                              [0, 0, 0, 0, 0.0])
        kind = next((k for k, tag in enumerate(OUTCOMES, 1) if case.find(tag) is not None), 0)
        row[kind] += 1
        row[4] += float(case.get("time") or 0)
    lines = [f"{e}\t{p:.0f}\t{f:.0f}\t{er:.0f}\t{sk:.0f}\t{t:.0f}\t{int(bool(f or er or sk))}"
             for e, (p, f, er, sk, t) in rows.items()]
    total = [sum(r[k] for r in rows.values()) for k in range(4)]
    skipped = int(total[3])
    lines.append(f"{name}\t" + "\t".join(f"{v:.0f}" for v in total)
                 + f"\t{wall}\t{rc or (1 if skipped else 0)}")
    return lines, skipped


def main() -> int:
    xml, name, wall, rc, *entries = sys.argv[1:]
    lines, skipped = summarise(xml, name, wall, int(rc), entries)
    print("\n".join(lines))
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
