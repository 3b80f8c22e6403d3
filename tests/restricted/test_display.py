"""``display()`` on the restricted backend (rich results): plain values become
display items (``text/plain``, ``application/json``) in order, one-shot and in a session
kernel, within the caps; the items reach a streaming caller as they are sent."""

from __future__ import annotations

import time
from dataclasses import replace

from sandboxd.models import Limits
from sandboxd.protocol.display import DisplayCaps
from sandboxd.results.streaming import StreamEvent
from tests.restricted.conftest import BackendHarness
from tests.support.plan import with_limits


def test_display_of_plain_values_in_order(harness: BackendHarness) -> None:
    res = harness.run("print('before')\ndisplay(41, {'a': [1, 2]})\nprint('after')\n"
                      "class P:\n    def __repr__(self):\n        return 'P()'\n"
                      "display(P())")
    assert res.status == "ok", res
    assert res.stdout == "before\nafter\n"
    assert [o.data for o in res.outputs] == [
        {"text/plain": "41", "application/json": 41},
        {"text/plain": "{'a': [1, 2]}", "application/json": {"a": [1, 2]}},
        {"text/plain": "P()"},
    ]
    assert not any(o.truncated for o in res.outputs)


def test_no_display_means_no_outputs_and_bad_use_is_a_python_error(
        harness: BackendHarness) -> None:
    assert harness.run("1 + 1").outputs == []
    res = harness.run("display(1, end='')")
    assert res.status == "error" and "TypeError" in res.stderr and res.outputs == []


def test_display_caps_cut_big_items_and_count(harness: BackendHarness) -> None:
    inv = harness.invocation("display('x' * 5000)\nfor i in range(10):\n    display(i)")
    inv = inv.model_copy(update={"plan": replace(inv.plan, display=DisplayCaps(4096, 4))})
    res = harness.call(harness.backend.run(with_limits(inv, Limits(timeout_s=10)),
                                           time.monotonic() + 10))
    assert res.status == "ok", res
    first = res.outputs[0]
    assert first.truncated and first.data["text/plain"].startswith("[display item cut:")
    assert [o.data.get("application/json") for o in res.outputs[1:4]] == [0, 1, 2]
    assert len(res.outputs) == 5 and res.outputs[4].truncated  # the count note, then nothing


def test_display_in_a_session_kernel_and_the_events_of_a_streaming_caller(
        harness: BackendHarness) -> None:
    ws = harness.workspace()
    seen: list[StreamEvent] = []

    def call(code: str) -> object:
        inv = harness.invocation(code, ws).model_copy(
            update={"session": "display-kernel", "events": seen.append})
        return harness.call(harness.backend.run(with_limits(inv, Limits(timeout_s=10)),
                                                time.monotonic() + 10))

    first = call("rows = [1, 2, 3]\ndisplay(rows)")
    second = call("rows.append(4)\ndisplay(sum(rows))")
    assert first.kernel is not None and second.kernel is not None
    assert second.kernel.calls == 2 and not second.kernel.fresh
    assert [o.data["application/json"] for o in first.outputs] == [[1, 2, 3]]
    assert [o.data["application/json"] for o in second.outputs] == [10]
    displays = [e.data for e in seen if e.kind == "display"]
    assert displays == [o.model_dump(mode="json") for o in [*first.outputs, *second.outputs]]
    harness.call(harness.backend.close_session("display-kernel"))
