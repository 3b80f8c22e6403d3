"""What ``import x`` hands to user code: a module proxy holding only allowlisted names."""

from __future__ import annotations

from typing import Any

from sandboxd.backends.restricted.lang.state import SandboxViolation


class ModuleProxy:
    """What ``import x`` gives user code: a fresh object holding only allowlisted names.

    It keeps no reference to the host module; writes to it are refused by ``_write_``.
    """

    __slots__ = ("__dict__",)

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        if "__name__" in self.__dict__:  # json.__init__(...) from user code
            raise SandboxViolation("modules cannot be modified in the sandbox")
        object.__setattr__(self, "__dict__", dict(values))
        self.__dict__["__name__"] = name

    def __repr__(self) -> str:
        return f"<module '{self.__dict__['__name__']}' (sandboxed)>"

    def __dir__(self) -> list[str]:
        return sorted(n for n in self.__dict__ if not n.startswith("_"))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"module '{self.__dict__['__name__']}' has no attribute '{name}' in the sandbox"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise SandboxViolation("modules cannot be modified in the sandbox")

    def __delattr__(self, name: str) -> None:
        raise SandboxViolation("modules cannot be modified in the sandbox")
