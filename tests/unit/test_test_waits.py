"""The one rule for waiting in tests (a fixed sleep is flaky on a slow host
and slow on a fast one): a test waits for the event it
needs with :func:`tests.support.wait.wait_until`, never for a fixed time and never by counting
processes. A deliberate sleep or count says why on its own line (``# sleep-ok: ...``,
``# count-ok: ...``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: the one module that sleeps to poll
WAIT = TESTS / "support" / "wait.py"
SLEEP_OK = re.compile(r"#\s*sleep-ok:\s*\S")
COUNT_OK = re.compile(r"#\s*count-ok:\s*\S")
#: calls that list processes: their length is a process count
PROCESS_LISTS = {"children", "descendants", "pids", "process_iter"}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _sleep_of(node: ast.Call, modules: dict[str, str], sleeps: dict[str, str]) -> str | None:
    """``time`` or ``asyncio`` when ``node`` calls that module's ``sleep``, else None."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "sleep" \
            and isinstance(func.value, ast.Name):
        return modules.get(func.value.id)
    if isinstance(func, ast.Name):
        return sleeps.get(func.id)
    return None


def _lists_processes(arg: ast.expr) -> bool:
    """``arg`` is a process list: a call to one of :data:`PROCESS_LISTS`, maybe wrapped in
    ``list()``/``set()``/``tuple()``/``sorted()`` or a comprehension over it."""
    if isinstance(arg, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return _lists_processes(arg.generators[0].iter)
    if not isinstance(arg, ast.Call):
        return False
    name = _name(arg.func)
    if name in PROCESS_LISTS:
        return True
    return name in {"list", "set", "tuple", "sorted"} and bool(arg.args) \
        and _lists_processes(arg.args[0])


def offenders(source: str, where: str) -> list[str]:
    """``where:line`` of every unexplained sleep and process count in ``source``."""
    tree = ast.parse(source, where)
    lines = source.splitlines()
    # the names ``time``/``asyncio`` (and their aliases) and a bare ``sleep`` imported from them
    modules = {"time": "time", "asyncio": "asyncio"}
    sleeps: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("time", "asyncio"):
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio"):
            for alias in node.names:
                if alias.name == "sleep":
                    sleeps[alias.asname or alias.name] = node.module

    def marked(node: ast.Call, mark: re.Pattern[str]) -> bool:
        end = node.end_lineno or node.lineno
        return any(mark.search(line) for line in lines[node.lineno - 1:end])

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        module = _sleep_of(node, modules, sleeps)
        if module is not None:
            zero = (len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == 0)
            if not (module == "asyncio" and zero) and not marked(node, SLEEP_OK):
                found.append((node.lineno, f"{module}.sleep"))
        elif isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1 \
                and _lists_processes(node.args[0]) and not marked(node, COUNT_OK):
            found.append((node.lineno, "a process count"))
    return [f"{where}:{line} {what}" for line, what in sorted(found)]


def test_tests_wait_for_events_not_for_time_or_process_counts() -> None:
    """Every sleep outside :mod:`tests.support.wait` and every process count carries its
    reason; fix an offender with ``wait_until`` (or say why it must be as it is)."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == WAIT:
            continue
        found += offenders(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert found == []


def test_the_checker_flags_an_unexplained_sleep_and_count() -> None:
    """The check above can fail: it sees each way of sleeping and counting, and only a
    reason on the line lets one pass."""
    flagged = """\
import asyncio
import time as clock
from asyncio import sleep as nap
from time import sleep
import psutil

clock.sleep(1)
sleep(0.5)
async def f():
    await asyncio.sleep(0.1)
    await nap(1)
    await asyncio.sleep(0)
time.sleep(0)  # sleep-ok:
assert len(psutil.Process(1).children(recursive=True)) == 2
assert len([p for p in psutil.process_iter()]) > 1
"""
    assert offenders(flagged, "x.py") == [
        "x.py:7 time.sleep", "x.py:8 time.sleep", "x.py:10 asyncio.sleep",
        "x.py:11 asyncio.sleep", "x.py:13 time.sleep", "x.py:14 a process count",
        "x.py:15 a process count"]
    explained = """\
import time
import psutil

time.sleep(1)  # sleep-ok: the CPU window the measurement is taken over
n = len(psutil.pids())  # count-ok: a bound on what may be left
s = "time.sleep(2)"  # data: the code a sandbox runs
"""
    assert offenders(explained, "y.py") == []
