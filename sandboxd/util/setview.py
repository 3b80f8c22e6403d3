"""A read-only view of disjoint sets as one set: membership, length and iteration without
a copy (a kernel host lists its sessions on every call; with thousands, a copy costs more
than the call's own work)."""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet


class DisjointUnion(AbstractSet[str]):
    """``a | b`` for sets that never share a member (their owner keeps them so), as a view:
    it sees later changes to them."""

    __slots__ = ("parts",)

    def __init__(self, *parts: AbstractSet[str]) -> None:
        self.parts = parts

    def __contains__(self, item: object) -> bool:
        return any(item in part for part in self.parts)

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            yield from part

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)
