"""The state allowed modules keep outside the user's names, carried with a hibernated kernel.

A kernel woken from hibernation must go on as if it had never slept: a session that seeded
``random`` draws the same numbers after as it would have without the sleep, and ``decimal``
keeps the precision it was given. That state lives in the modules, not in the namespace, so
:func:`capture` takes it as plain data (ints, strings, lists: nothing the unpickler must
admit) beside the names, and :func:`apply` sets it again in the woken kernel. A fork does
not apply it: a fork's ``random`` is reseeded (its draws must differ from its siblings') and
its ``decimal`` context is the default, as after a fresh start.

What is not carried (rare, and said in the docs): other module-level settings such as
``calendar.setfirstweekday`` or ``csv.field_size_limit``.
"""

from __future__ import annotations

import decimal
import random
from typing import Any

#: the ``decimal`` context's fields carried as they are
_DECIMAL_FIELDS = ("prec", "Emin", "Emax", "capitals", "clamp")


def capture() -> dict[str, Any]:
    """The modules' state now, as plain data."""
    ctx = decimal.getcontext()
    return {
        "random": random.getstate(),
        "decimal": {
            **{name: getattr(ctx, name) for name in _DECIMAL_FIELDS},
            "rounding": ctx.rounding,
            "traps": sorted(s.__name__ for s, on in ctx.traps.items() if on),
            "flags": sorted(s.__name__ for s, on in ctx.flags.items() if on),
        },
    }


def apply(state: Any) -> None:
    """Set the modules' state from :func:`capture`'s data (written in the kernel's own
    sandbox before it slept: anything else raises ``ValueError``/``TypeError``, and the
    state is not restored)."""
    if type(state) is not dict:
        raise TypeError("the modules' state is not a mapping")
    version, internal, gauss = state["random"]
    if type(internal) is not tuple or not all(type(i) is int for i in internal):
        raise TypeError("random's state is not a tuple of ints")
    random.setstate((version, internal, gauss))
    saved = state["decimal"]
    signals = {s.__name__: s for s in decimal.getcontext().traps}
    ctx = decimal.Context(
        rounding=saved["rounding"],
        traps=[signals[name] for name in saved["traps"]],
        flags=[signals[name] for name in saved["flags"]],
        **{name: saved[name] for name in _DECIMAL_FIELDS})
    decimal.setcontext(ctx)
