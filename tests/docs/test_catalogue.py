"""Every fenced block of the README and docs/*.md is in the catalogue (run, shown output of a
run, or skipped with a reason), and each entry names exactly one block: a new doc example
cannot escape the tests. Also the comparisons themselves, on the samples that were wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import (
    Block,
    all_blocks,
    console_commands,
    layout_missing,
    pipeline,
    substitute,
)
from tests.docs.catalogue import CATALOGUE, Entry
from tests.docs.compare import output_problems, shape_problems, sse_problems
from tests.docs.test_examples import RUNNERS


def unclassified(blocks: list[Block], catalogue: tuple[Entry, ...]) -> list[str]:
    """What is wrong between the blocks and the catalogue, one line each."""
    problems = []
    for block in blocks:
        names = [e for e in catalogue if e.file == block.file and e.marker in block.text]
        if len(names) != 1:
            problems.append(f"{block}: named by {len(names)} catalogue entries "
                            "(tests/docs/catalogue.py: run it, or skip it with a reason)")
    for entry in catalogue:
        found = [b for b in blocks if b.file == entry.file and entry.marker in b.text]
        if len(found) != 1:
            problems.append(f"catalogue entry {entry.id!r} names {len(found)} blocks")
        kinds = [entry.run is not None, entry.skip is not None, entry.output_of is not None]
        if sum(kinds) != 1:
            problems.append(f"{entry.id}: exactly one of run, skip, output_of")
        if entry.run is not None and entry.run not in RUNNERS:
            problems.append(f"{entry.id}: no runner {entry.run!r}")
        if entry.skip is not None and len(entry.skip) < 20:
            problems.append(f"{entry.id}: a skip needs its reason")
        if entry.output_of is not None and not any(
                e.marker == entry.output_of and e.output == entry.marker for e in catalogue):
            problems.append(f"{entry.id}: no run entry shows its output here")
    return problems


def test_every_doc_block_is_run_or_skipped_with_a_reason() -> None:
    blocks = all_blocks()
    assert len(blocks) >= 20, [str(b) for b in blocks]
    assert unclassified(blocks, CATALOGUE) == []


def test_a_new_example_fails_until_it_is_classified(tmp_path: Path) -> None:
    """A block added to any doc, in any language, is reported; so is a stale entry."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```sh\nmake run    # virtualenv\n```\n")
    (tmp_path / "docs" / "new.md").write_text("text\n\n  ~~~python\n  import sandboxd\n  ~~~\n")
    blocks = all_blocks(tmp_path)
    assert [(b.file, b.line, b.lang) for b in blocks] == [("README.md", 3, "sh"),
                                                          ("docs/new.md", 3, "python")]
    problems = unclassified(blocks, CATALOGUE)
    assert any(p.startswith("docs/new.md:3 ```python") for p in problems), problems
    assert any("names 0 blocks" in p for p in problems), problems  # the other entries


def test_console_commands_run_without_a_shell() -> None:
    (cmd,) = console_commands("$ curl -s localhost:8765/x -d '{\"a\": 1}' \\\n"
                              "    | jq -c . # a comment\n{\"a\":1}\n")
    assert cmd.output == "{\"a\":1}"
    stages = pipeline(cmd.line)
    assert stages == [["curl", "-s", "localhost:8765/x", "-d", "{\"a\": 1}"], ["jq", "-c", "."]]
    assert substitute(stages[0], "http://127.0.0.1:4242", {})[2] == "127.0.0.1:4242/x"
    assert substitute(["$SID/f"], "http://x", {"SID": "s1"}) == ["s1/f"]
    for line in ("a; b", "a && b", "a > f", "echo $(id)", "a & b"):
        with pytest.raises(ValueError, match="needs a shell"):
            pipeline(line)


REAL: dict[str, Any] = {"id": "inv_1", "status": "ok", "stdout": "42\n", "kernel": None,
                        "outputs": [], "cleanup": {"verified": True, "detail": None}}


def test_shape_comparison_names_missing_and_extra_keys() -> None:
    """The README's first sample lacked ``kernel`` and ``outputs``, its result schema
    ``cleanup.detail``: each is named."""
    doc = {"id": "inv_…", "status": "ok | error", "stdout": "42\n", "cleanup": {"verified": True},
           "extra": 1}
    problems = shape_problems(doc, REAL)
    assert problems == [".: key 'kernel' is missing from the doc",
                        ".: key 'outputs' is missing from the doc",
                        ".: the doc shows key 'extra' that the real result lacks",
                        "cleanup: key 'detail' is missing from the doc"]
    fixed = {k: v for k, v in doc.items() if k != "extra"} | {
        "kernel": None, "outputs": [], "cleanup": {"verified": True, "detail": None}}
    assert shape_problems(fixed, REAL) == []


def test_value_comparison_ellipsis_and_volatile_paths() -> None:
    doc = json.dumps({"id": "inv_…", "status": "ok", "stdout": "42\n", "kernel": None,
                      "outputs": [], "cleanup": {"verified": True, "detail": None}})
    assert output_problems(doc, json.dumps(REAL)) == []
    assert output_problems(doc, json.dumps(REAL | {"status": "error"})) == [
        "status: the doc shows 'ok', the real result 'error'"]
    assert output_problems(doc.replace("inv_…", "inv_2"), json.dumps(REAL), ("id",)) == []
    assert output_problems("[\"a, …\"]", "[\"a, b, c.\"]") == []
    assert output_problems("[\"a, …\"]", "[\"b, c.\"]") != []


def test_event_stream_comparison() -> None:
    doc = "event: stdout\ndata: {\"text\":\"a\\n\"}\n\nevent: result\ndata: {\"id\":\"inv_…\",…}\n"
    real = ("event: stdout\ndata: {\"text\":\"a\\n\"}\n\n: ping\n\n"
            "event: result\ndata: {\"id\":\"inv_9\",\"status\":\"ok\"}\n\n")
    assert sse_problems(doc, real) == []
    assert sse_problems(doc, real.replace("stdout", "stderr")) != []
    assert sse_problems(doc.replace("\"a\\n", "\"b\\n"), real) != []


def test_layout_names_are_checked(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "top.py"):
        (tmp_path / name).write_text("")
    text = ("pkg/a.py b.py     what a and b do; see top.py\n"
            "pkg/sub/          c.py (c), d.py (gone)\n"
            "                  e.py on a continuation line\n"
            "gone/ top.py      x\n")
    assert layout_missing(text, tmp_path) == ["d.py", "e.py", "gone/"]
