"""The shipped unit file's install comment says what docs/operations.md's install block (the
one the VM job runs verbatim) does, and its ``Documentation=`` names only files that block
installs."""

from __future__ import annotations

import re

from tests.docs.blocks import REPO

UNIT = REPO / "systemd" / "sandboxd.service"
OPS = REPO / "docs" / "operations.md"


def _install_block() -> list[str]:
    text = OPS.read_text()
    block = text.split("<!-- install:begin -->", 1)[1].split("<!-- install:end -->", 1)[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("```")]


def _unit_install_comment() -> list[str]:
    lines = []
    for ln in UNIT.read_text().splitlines():
        if not ln.startswith("#"):
            break
        if ln.startswith("#   "):
            lines.append(ln[4:])
    return lines


def _norm(line: str) -> str:
    return " ".join(line.split())


def test_the_unit_installs_as_the_docs_do() -> None:
    ours = [_norm(ln) for ln in _unit_install_comment()]
    docs = [_norm(ln) for ln in _install_block()]
    assert ours, "the unit file says nothing of how it is installed"
    assert ours == docs[:len(ours)], (ours, docs)
    assert not any(re.search(r"pip install sandboxd\b", ln) for ln in ours)


def test_the_units_documentation_is_installed() -> None:
    links = re.findall(r"^Documentation=(.*)$", UNIT.read_text(), flags=re.M)
    assert links
    installed = [_norm(ln).split()[-1] for ln in _install_block() if ln.startswith("install ")]
    for link in " ".join(links).split():
        assert link.startswith("file://"), link  # nothing else is known to exist offline
        assert link.removeprefix("file://") in installed, (link, installed)
