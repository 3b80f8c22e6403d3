"""The service is one class made of mixins (``SessionOps``, ``SessionRestarts``,
``HealthOps``); a mixin names what another provides with a stub that raises
``NotImplementedError``. A stub must never be what the service resolves: the order of the
bases decides, and a wrong order raises only when the path runs."""

from __future__ import annotations

import ast
import inspect
import textwrap

from sandboxd.service import Sandboxd


def _is_stub(function: object) -> bool:
    try:
        source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    body = [n for n in node.body if not (isinstance(n, ast.Expr)
                                         and isinstance(n.value, ast.Constant))]
    return (len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None
            and "NotImplementedError" in ast.unparse(body[0].exc))


def test_the_service_resolves_no_stub() -> None:
    stubs = [name for name, value in inspect.getmembers(Sandboxd, inspect.isfunction)
             if _is_stub(value)]
    assert stubs == []


def test_the_check_can_fail() -> None:
    class Stubbed:
        def provided_elsewhere(self) -> None:  # pragma: no cover - never called
            raise NotImplementedError

    assert _is_stub(Stubbed.provided_elsewhere)
