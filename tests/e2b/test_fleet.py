"""A fleet behind HAProxy: an E2B sandbox made through the proxy is served by its node for
every later request, control plane (the id in the path) and sandbox plane (the
``E2b-Sandbox-Id`` header) alike. Three real daemons (restricted backend) behind a real
HAProxy with the configuration ``sandboxd fleet haproxy-config`` writes."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.fleet import running_fleet

SANDBOXES = 9


def test_every_e2b_request_lands_on_its_sandboxs_node(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b_code_interpreter import Sandbox

    with running_fleet(tmp_path) as fleet:  # type: ignore[arg-type]
        for key, value in {"E2B_API_URL": fleet.url, "E2B_SANDBOX_URL": fleet.url,
                           "E2B_API_KEY": "unused-without-tokens"}.items():
            monkeypatch.setenv(key, value)
        sandboxes = [Sandbox.create() for _ in range(SANDBOXES)]
        placed = Counter(s.sandbox_id.split("_")[1] for s in sandboxes)
        assert len(placed) > 1, placed  # spread over the nodes (leastconn)
        for n, sbx in enumerate(sandboxes):
            sbx.run_code(f"mine = {n}")
        for n, sbx in enumerate(sandboxes):  # a kernel's state lives on its node only
            assert sbx.run_code("mine").text == str(n)
            assert sbx.get_info().sandbox_id == sbx.sandbox_id
            sbx.set_timeout(300)
        for sbx in sandboxes:
            assert sbx.kill()
