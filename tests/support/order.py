"""Execution order, one order for everything a call prints: the code both backends' ordering tests
run, and the check that a result's ``outputs`` (their positions) and the SSE stream follow
execution order."""

from __future__ import annotations

import json
from typing import Any

import httpx
from httpx_sse import connect_sse

from sandboxd.models import Result
from sandboxd.results.items import Output

#: prints and display items, alternating (several times, so that a reader that relays its
#: pipes in any other order than they were written gets caught)
ORDER_CODE = """\
for i in range(6):
    print('p' + str(i))
    display(i)
print('end')
display('last')
print('after')
"""

#: what it shows, in order: ("stdout", text) or ("display", the item's JSON)
EXPECTED: list[tuple[str, Any]] = [
    part for i in range(6) for part in (("stdout", f"p{i}\n"), ("display", i))
] + [("stdout", "end\n"), ("display", "last"), ("stdout", "after\n")]


def _merged(parts: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Adjacent text of one stream as one part (a stream may cut its text anywhere)."""
    merged: list[tuple[str, Any]] = []
    for kind, data in parts:
        if merged and kind == merged[-1][0] and kind != "display":
            merged[-1] = (kind, merged[-1][1] + data)
        else:
            merged.append((kind, data))
    return merged


def result_order(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The result's stdout, stderr and items in the order their positions say."""
    parts: list[tuple[str, Any]] = []
    for part in Result.model_validate(result).sequence():
        if isinstance(part, Output):
            parts.append(("display", part.data["application/json"]))
        else:
            parts.append(part)
    return _merged(parts)


def stream_order(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The stream's output events in the order they came."""
    parts = [(kind, data["text"] if kind != "display" else data["data"]["application/json"])
             for kind, data in events if kind in ("stdout", "stderr", "display")]
    return _merged(parts)


def stream(url: str, headers: dict[str, str], body: dict[str, Any],
           tool: str = "python") -> list[tuple[str, Any]]:
    """Every event of one streamed call of ``tool``: (kind, data)."""
    events: list[tuple[str, Any]] = []
    with httpx.Client(base_url=url, headers=headers, timeout=120) as c, \
            connect_sse(c, "POST", f"/v1/tools/{tool}/invoke", json=body,
                        headers={"Accept": "text/event-stream"}) as src:
        assert src.response.status_code == 200, src.response.read()
        for sse in src.iter_sse():
            events.append((sse.event, json.loads(sse.data)))
    return events


def check_order(events: list[tuple[str, Any]], last_shown: str = "'last'") -> dict[str, Any]:
    """The streamed call of :data:`ORDER_CODE` kept execution order in its events and in its
    result (positions, the model's text, where the display of ``'last'`` reads as
    ``last_shown``: its language's own text for a string); returns the result."""
    assert events and events[-1][0] == "result", events
    result = events[-1][1]
    assert result["status"] == "ok", result
    assert stream_order(events) == EXPECTED, stream_order(events)
    assert result_order(result) == EXPECTED, result["outputs"]
    displays = [data for kind, data in events if kind == "display"]
    assert displays == result["outputs"]  # the same items, positions included
    assert [o["at"] for o in result["outputs"]][:2] == [{"stdout": 3, "stderr": 0},
                                                         {"stdout": 6, "stderr": 0}]
    from sandboxd_client.render import format_result

    text = format_result(Result.model_validate(result))
    assert text.startswith("stdout:\np0\ndisplay:\n0\nstdout:\np1\ndisplay:\n1\n"), text
    assert text.endswith(f"stdout:\nend\ndisplay:\n{last_shown}\nstdout:\nafter"), text
    return result
