"""The table every session language's kernel is held to (tests/parity/test_kernel_parity.py):
one :class:`Language` entry per language, naming its code for each row of :data:`ROWS`, or why
the row does not apply to it. A new language is one more entry in :data:`LANGUAGES`; a row
added here must be answered by every language."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.support.order import ORDER_CODE

#: what each row holds a kernel to (the test runs each in a fresh session, after ``plant``)
ROWS = {
    "value": "the call's value or output, as the model reads it",
    "error": "an error: its status, the failing line or the last command's exit status; "
             "the kernel's state is kept",
    "stream": "stdout and stderr streamed in the order they were written (the result keeps "
              "each whole)",
    "display": "display items in order with the prints",
    "runaway": "a busy loop past its deadline is interrupted and the state kept",
    "sleeping": "a call waiting in a sleep past its deadline is interrupted (what it would "
                "have printed after, never) and the state kept",
    "deaf": "code that ignores the interrupt is killed after the grace, its kernel lost "
            "(kernel.lost, with the reason); the next call is fresh",
}


@dataclass(frozen=True)
class Row:
    """One row's code in one language, and what its result must hold besides the row's own
    checks: ``fields`` by dotted path (``termination.exit_code``), text ``stderr`` has."""

    code: str
    fields: dict[str, Any] = field(default_factory=dict)
    stderr_has: str | None = None
    #: the display row: how the model reads the display of the string 'last'
    last_shown: str = "'last'"


@dataclass(frozen=True)
class Language:
    """A session language: its tool; ``plant``, code that leaves state of every kind its
    kernel keeps; ``read``, code that prints ``kept`` while all of that state is there and
    ``gone`` once it is lost; and each row of :data:`ROWS` (a string: why it does not
    apply)."""

    tool: str
    plant: str
    read: str
    rows: dict[str, Row | str]


#: the stream row's output, the same in every language: (stream, text) in writing order
STREAMED = [(k, f"{w}{i}\n") for i in (1, 2, 3) for k, w in (("stdout", "out"), ("stderr", "err"))]

PYTHON = Language(
    tool="python",
    plant="import time\nkept = 'kept'\ndef show():\n    print(kept)\n",
    read="show() if 'show' in globals() and 'time' in globals() else print('gone')",
    rows={
        "value": Row("6 * 7", {"status": "ok", "value": 42, "stdout": ""}),
        "error": Row("y = 1\nz = y / 0\n", {
            "status": "error", "termination.exit_code": 1,
            "message": "ZeroDivisionError: division by zero"}, stderr_has="line 2"),
        "stream": Row("import sys\nfor i in (1, 2, 3):\n    print(f'out{i}', flush=True)\n"
                      "    print(f'err{i}', file=sys.stderr, flush=True)\n    time.sleep(0.2)"),
        "display": Row(ORDER_CODE),
        "runaway": Row("while True:\n    pass", stderr_has="KeyboardInterrupt"),
        "sleeping": Row("print('before', flush=True)\ntime.sleep(60)\nprint('never')",
                        {"stdout": "before\n"}),
        "deaf": Row("while True:\n    try:\n        while True:\n            pass\n"
                    "    except KeyboardInterrupt:\n        pass"),
    },
)

BASH = Language(
    tool="bash",
    plant="mkdir -p d && cd d; export V=kept; f() { echo \"$V\"; }; alias show=f",
    read="[[ $PWD == /workspace/d ]] && show 2>/dev/null || echo gone",
    rows={
        "value": Row("echo $((6 * 7))", {"status": "ok", "value": None, "stdout": "42\n"}),
        "error": Row("echo a\n(exit 3)", {
            "status": "error", "termination.exit_code": 3, "stdout": "a\n",
            "message": "line 2: ( exit 3 ): exit status 3"}),
        "stream": Row("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done"),
        "display": "bash has no display(): what it shows is its two streams",
        "runaway": Row("while :; do :; done", {"termination.exit_code": 130}),  # SIGINT
        "sleeping": Row("echo before; sleep 60; echo never",
                        {"stdout": "before\n", "termination.exit_code": 130}),
        "deaf": Row("trap '' INT; while :; do :; done"),
    },
)

#: :data:`ORDER_CODE` in JavaScript: the same prints and displays in the same order
JS_ORDER_CODE = """\
for (let i = 0; i < 6; i++) { console.log('p' + i); display(i) }
console.log('end')
display('last')
console.log('after')
"""

JAVASCRIPT = Language(
    tool="javascript",
    plant="const path = require('path')\nlet kept = 'kept'\n"
          "function show() { console.log(kept) }",
    read="typeof show === 'function' && typeof path === 'object' ? show() : console.log('gone')",
    rows={
        "value": Row("6 * 7", {"status": "ok", "value": 42, "stdout": ""}),
        "error": Row("let y = 1\nnull.boom\n", {
            "status": "error",
            "message": "TypeError: Cannot read properties of null (reading 'boom')"},
            stderr_has="<code>:2:"),
        "stream": Row("for (const i of [1, 2, 3]) { console.log('out' + i); "
                      "console.error('err' + i); await new Promise((r) => setTimeout(r, 200)) }"),
        "display": Row(JS_ORDER_CODE, last_shown="last"),  # as console.log shows it
        "runaway": Row("while (true) {}"),
        "sleeping": Row("console.log('before')\n"
                        "await new Promise((r) => setTimeout(r, 60000))\nconsole.log('never')",
                        {"stdout": "before\n"}),
        # after an await a busy loop runs where neither node's SIGINT watchdog nor a
        # listener reaches it: the kernel is killed after the grace (docs/languages.md)
        "deaf": Row("await null; while (true) {}"),
    },
)

#: every session language
LANGUAGES = {lang.tool: lang for lang in (PYTHON, BASH, JAVASCRIPT)}
