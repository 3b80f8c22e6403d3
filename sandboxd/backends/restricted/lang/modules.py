"""The import hook of the sandbox and the module proxies it hands out."""

from __future__ import annotations

import sys
from typing import Any

from sandboxd.backends.restricted.lang.guards import SafeFormatter, expose
from sandboxd.backends.restricted.lang.module_allowlist import MODULES
from sandboxd.backends.restricted.lang.output import sandbox_pprint
from sandboxd.backends.restricted.lang.proxy import ModuleProxy
from sandboxd.protocol.rules import import_verdict

EXTRA_PROXY_VALUES: dict[str, dict[str, Any]] = {
    "string": {"Formatter": SafeFormatter},
    "pprint": {"pprint": sandbox_pprint, "pp": sandbox_pprint},
}


def make_proxy(name: str) -> ModuleProxy:
    module, names = MODULES[name]
    values = {n: getattr(module, n) for n in names}
    values.update(EXTRA_PROXY_VALUES.get(name, {}))
    return ModuleProxy(name, values)


@expose()
class ImportHook:
    """``__import__`` of the sandbox: the policy's ``imports`` rule
    (:func:`sandboxd.protocol.rules.import_verdict`), and only modules this backend supports."""

    def __init__(self, allow: list[str], deny: list[str]) -> None:
        self.allow = list(allow)
        self.deny = list(deny)
        self.cache: dict[str, ModuleProxy] = {}

    def allowed(self, name: str, fromlist: tuple[str, ...] = ()) -> bool:
        return import_verdict(name, self.allow, self.deny, fromlist)[0]

    def __call__(
        self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> ModuleProxy:
        if type(fromlist) is list and level == 0 and name in sys.modules:
            # PyImport_Import() from C code of an allowed module (datetime.strftime importing
            # time): it passes a list and then takes sys.modules[name] itself; user code cannot
            # call __import__ (compiled imports pass a tuple or None), so nothing reaches it.
            return None  # type: ignore[return-value]
        if level != 0:
            raise ImportError("relative imports are not allowed in the sandbox")
        if type(name) is not str:  # a str subclass could answer the rule's comparisons itself
            raise ImportError("bad module name")
        names = tuple(f for f in fromlist if type(f) is str) if type(fromlist) is tuple else ()
        if not self.allowed(name, names):
            allowed = ", ".join(sorted(n for n in MODULES if self.allowed(n))) or "none"
            raise ImportError(
                f"import of '{name}' is not allowed by the policy; allowed modules: {allowed}"
            )
        if name not in MODULES:
            raise ImportError(
                f"module '{name}' is allowed by the policy but not available in "
                f"the restricted python backend"
            )
        proxy = self.cache.get(name)
        if proxy is None:
            proxy = self.cache[name] = make_proxy(name)
        return proxy
