"""The one deadline idiom (:func:`within`, :func:`stop_task`): defined in the client package,
whose agent loop bounds its local tools with it too (:mod:`sandboxd_client.deadline`);
:func:`bounded` is :func:`within` for a caller that treats the deadline as an error."""

from collections.abc import Awaitable
from typing import TypeVar

from sandboxd_client.deadline import stop_task, within

__all__ = ["bounded", "stop_task", "within"]

T = TypeVar("T")


async def bounded(aw: Awaitable[T], timeout: float) -> T:
    """``aw``'s result, or :class:`TimeoutError` once ``timeout`` seconds have passed (``aw``
    then cancelled and waited for, as :func:`within` does)."""
    done, value = await within(aw, timeout)
    if not done:
        raise TimeoutError(f"not done within {timeout:g} s")
    return value
