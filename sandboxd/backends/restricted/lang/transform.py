"""The compile step: RestrictedPython's transformer with the sandbox's additions."""

from __future__ import annotations

import ast
import types
from typing import Any, cast

from RestrictedPython.compile import compile_restricted_exec
from RestrictedPython.transformer import (
    IOPERATOR_TO_STR,
    RestrictingNodeTransformer,
    copy_locations,
)

from sandboxd.backends.restricted.lang.allowlist import (
    ALLOWED_DUNDER_DEFS,
    ALLOWED_DUNDER_READS,
    FORBIDDEN_ATTRS,
    is_private_attr,
)
from sandboxd.backends.restricted.lang.state import SANDBOX_FILENAME


def _call(func: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(func, ast.Load()), args=list(args), keywords=[])


class SandboxTransformer(RestrictingNodeTransformer):
    """RestrictedPython's transformer with the additions described in the module docstring."""

    def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
        if allow_magic_methods and name in ALLOWED_DUNDER_DEFS and node.col_offset != 0:
            return
        super().check_name(node, name, allow_magic_methods)

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id == "__name__" and isinstance(node.ctx, ast.Load):
            return node
        return super().visit_Name(node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        attr = node.attr
        if attr in FORBIDDEN_ATTRS:
            self.error(node, f'"{attr}" is a restricted name, that is forbidden to access.')
            return node
        load = isinstance(node.ctx, ast.Load)
        if (load and attr in ALLOWED_DUNDER_READS) or is_private_attr(attr):
            node = self.node_contents_visit(node)
            if load:
                new = _call("_getattr_", node.value, ast.Constant(attr))
                copy_locations(new, node)
                return new
            new_value = _call("_write_", node.value)
            copy_locations(new_value, node.value)
            node.value = new_value
            return node
        return super().visit_Attribute(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        """``x: T = v`` runs as ``x = v`` (annotations are dropped); ``x: T`` is a no-op."""
        if node.value is None:
            new: ast.stmt = ast.Pass()
            copy_locations(new, node)
            return new
        new = ast.Assign(targets=[node.target], value=node.value)
        copy_locations(new, node)
        return self.visit(new)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> Any:
        for name in node.names:
            self.check_name(node, name)
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        op = IOPERATOR_TO_STR[type(node.op)]
        if isinstance(target, ast.Attribute):
            attr = target.attr
            if attr in FORBIDDEN_ATTRS or (attr.startswith("_") and not is_private_attr(attr)):
                self.error(node, f'"{attr}" is an invalid attribute name.')
                return node
            obj = self.visit(target.value)
            value = self.visit(node.value)
            new = ast.Expr(_call("_sbx_augattr_", obj, ast.Constant(attr), ast.Constant(op), value))
            copy_locations(new, node)
            ast.fix_missing_locations(new)
            return new
        if isinstance(target, ast.Subscript):
            obj = self.visit(target.value)
            key = self.visit(target.slice)
            value = self.visit(node.value)
            new = ast.Expr(_call("_sbx_augitem_", obj, key, ast.Constant(op), value))
            copy_locations(new, node)
            ast.fix_missing_locations(new)
            return new
        return super().visit_AugAssign(node)

    def _guard_block(self, body: list[ast.stmt], where: ast.stmt | ast.excepthandler) -> None:
        check = ast.Expr(_call("_sbx_limit_check_"))
        copy_locations(check, where)
        ast.fix_missing_locations(check)
        body.insert(0, check)

    def visit_Try(self, node: ast.Try) -> Any:
        # RestrictedPython's visit_Try returns the node it was given (typed as any visit result)
        node = cast(ast.Try, super().visit_Try(node))
        for handler in node.handlers:
            self._guard_block(handler.body, handler)
        if node.finalbody:
            self._guard_block(node.finalbody, node)
        return node

    def visit_Module(self, node: ast.Module) -> Any:
        # RestrictedPython's visit_Module returns the module it was given
        node = cast(ast.Module, super().visit_Module(node))
        if node.body and isinstance(node.body[-1], ast.Expr):
            last = node.body[-1]
            new = ast.Expr(_call("_sbx_set_value_", last.value))
            copy_locations(new, last)
            ast.fix_missing_locations(new)
            node.body[-1] = new
        return node


def compile_user_code(source: str) -> tuple[types.CodeType | None, list[str]]:
    """Compile ``source`` with :class:`SandboxTransformer`; ``(code, errors)``."""
    try:
        result = compile_restricted_exec(
            source, filename=SANDBOX_FILENAME, policy=SandboxTransformer
        )
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return None, [f"{type(exc).__name__}: {exc}"]
    return result.code, list(result.errors)
