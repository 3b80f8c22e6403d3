"""The one codec convention of the protocol: a record is a frozen dataclass whose wire
members each carry their bound as field metadata (:func:`member`), and :class:`Record` turns
it to and from its JSON-ready form by looping over those fields, as :mod:`.limits` does for
the limits. A new member is one line with its bound; no decoder is written by hand.

What crosses the wire is decoded boundedly: each :class:`Codec` takes a JSON value and the
name to blame, and returns it typed or raises ``ValueError`` saying what was expected (never
a value too long, too many entries, an unknown key, a bool for a number). Standard library
only: the container image carries this package.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

MAX_TEXT = 1024 * 1024  # characters of one string (a word, a path, a value)

_T = TypeVar("_T")


class Codec(Generic[_T]):
    """How one value crosses the wire: :meth:`decode` checks and types it (``ValueError``
    naming ``what`` otherwise), :meth:`encode` gives its JSON-ready form."""

    def decode(self, value: Any, what: str) -> _T:
        raise NotImplementedError

    def encode(self, value: _T) -> Any:
        return value


class Flag(Codec[bool]):
    """true or false."""

    def decode(self, value: Any, what: str) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{what} must be true or false")
        return value


@dataclass(frozen=True)
class Int(Codec[int]):
    """A whole number (not a bool) from ``low`` to ``high``."""

    low: int
    high: int

    def decode(self, value: Any, what: str) -> int:
        if (isinstance(value, bool) or not isinstance(value, int)
                or not self.low <= value <= self.high):
            raise ValueError(f"{what} must be a whole number from {self.low} to {self.high}")
        return value


@dataclass(frozen=True)
class Seconds(Codec[float]):
    """A finite number of seconds from ``low`` to ``high`` (a whole number is made a float)."""

    low: float
    high: float

    def decode(self, value: Any, what: str) -> float:
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not self.low <= value <= self.high):
            raise ValueError(
                f"{what} must be a number of seconds from {self.low:g} to {self.high:g}")
        return float(value)


@dataclass(frozen=True)
class Text(Codec[str]):
    """A string of at most ``most`` characters."""

    most: int = MAX_TEXT

    def decode(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or len(value) > self.most:
            raise ValueError(f"{what} must be a string of at most {self.most} characters")
        return value


@dataclass(frozen=True)
class Hex(Codec[str]):
    """Lower-case hex digits, at most ``most`` of them."""

    most: int

    def decode(self, value: Any, what: str) -> str:
        if (not isinstance(value, str) or len(value) > self.most
                or any(c not in "0123456789abcdef" for c in value)):
            raise ValueError(f"{what} must be lower-case hex of at most {self.most} digits")
        return value


@dataclass(frozen=True)
class Choice(Codec[Any]):
    """One of ``allowed`` (strings); made a member of ``enum`` when one is given."""

    allowed: tuple[str, ...]
    enum: type[Enum] | None = None

    @classmethod
    def of(cls, enum: type[Enum]) -> Choice:
        """The values of a string enum, decoded to its members."""
        return cls(tuple(str(member.value) for member in enum), enum)

    def decode(self, value: Any, what: str) -> Any:
        if not isinstance(value, str) or value not in self.allowed:
            raise ValueError(f"{what} must be one of {list(self.allowed)}")
        return value if self.enum is None else self.enum(value)

    def encode(self, value: Any) -> Any:
        return value.value if isinstance(value, Enum) else value


@dataclass(frozen=True)
class OrNone(Codec[_T | None]):
    """``None``, or what ``inner`` decodes."""

    inner: Codec[_T]

    def decode(self, value: Any, what: str) -> _T | None:
        return None if value is None else self.inner.decode(value, what)

    def encode(self, value: _T | None) -> Any:
        return None if value is None else self.inner.encode(value)


@dataclass(frozen=True)
class ListOf(Codec[tuple[_T, ...]]):
    """A list of ``least`` to ``most`` entries, each decoded by ``item`` (a tuple)."""

    item: Codec[_T]
    most: int
    least: int = 0

    def decode(self, value: Any, what: str) -> tuple[_T, ...]:
        if not isinstance(value, list):
            raise ValueError(f"{what} must be a list")
        if not self.least <= len(value) <= self.most:
            raise ValueError(f"{what} must have {self.least} to {self.most} entries")
        return tuple(self.item.decode(v, f"{what}[{i}]") for i, v in enumerate(value))

    def encode(self, value: tuple[_T, ...]) -> Any:
        return [self.item.encode(v) for v in value]


@dataclass(frozen=True)
class MapOf(Codec[dict[str, _T]]):
    """An object of at most ``most`` entries (``noun`` says what they are), its keys decoded
    by ``key`` and its values by ``value``."""

    key: Codec[str]
    value: Codec[_T]
    most: int
    noun: str = "entries"

    def decode(self, value: Any, what: str) -> dict[str, _T]:
        if not isinstance(value, dict) or len(value) > self.most:
            raise ValueError(f"{what} must be an object of at most {self.most} {self.noun}")
        return {self.key.decode(k, f"{what} key"): self.value.decode(v, f"{what}[{k}]")
                for k, v in value.items()}

    def encode(self, value: dict[str, _T]) -> Any:
        return {k: self.value.encode(v) for k, v in value.items()}


@dataclass(frozen=True)
class Nested(Codec[_T]):
    """A record of its own (anything with ``from_wire(data, what)`` and ``to_wire()``)."""

    kind: Any  # the record class: a Record, or Limits

    def decode(self, value: Any, what: str) -> _T:
        return cast(_T, self.kind.from_wire(value, what))

    def encode(self, value: _T) -> Any:
        return cast(Any, value).to_wire()


@dataclass(frozen=True)
class Part(Codec[_T]):
    """A record of its own whose members sit among its parent's on the wire (one flat
    object): a part of a record that only some readers use, typed apart without changing the
    wire form. ``kind`` is a :class:`Record`; its member names must not collide with the
    parent's."""

    kind: Any  # the part's Record class

    def decode(self, value: Any, what: str) -> _T:
        return cast(_T, self.kind.from_wire(value, what))

    def encode(self, value: _T) -> Any:
        return cast(Any, value).to_wire()


@dataclass(frozen=True)
class Member:
    """A wire member's metadata: its codec, whether a record must send it (a member without
    a default always must), whether :meth:`Record.to_wire` leaves it out at its default."""

    codec: Codec[Any]
    required: bool = False
    omit_default: bool = False


def member(codec: Codec[Any], default: Any = MISSING, *, factory: Any = MISSING,
           required: bool = False, omit_default: bool = False, kw_only: bool = False) -> Any:
    """A dataclass field that crosses the wire under ``codec`` (no ``default`` nor
    ``factory``: the member is required). The wire form lists members in declaration order
    (``kw_only`` lets a member with a default come before one without)."""
    meta = {"wire": Member(codec, required, omit_default)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta, kw_only=kw_only)
    return field(default=default, metadata=meta, kw_only=kw_only)


def _has_default(f: Field[Any]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _default(f: Field[Any]) -> Any:
    return f.default if f.default is not MISSING else cast(Any, f.default_factory)()


def check_obj(data: Any, what: str, keys: tuple[str, ...],
              required: tuple[str, ...]) -> Mapping[str, Any]:
    """An object with no key but ``keys`` and every one of ``required``."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object")
    unknown = set(data) - set(keys)
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(map(str, unknown))}")
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"{what}: missing {missing}")
    return data


class Record:
    """A frozen dataclass that crosses the wire: its :func:`member` fields are its members
    (a field without that metadata never crosses). ``WIRE_NAME`` names it in errors,
    ``WIRE_MEMBER`` names a member (``{what}`` and ``{name}`` are filled in)."""

    WIRE_NAME: ClassVar[str] = "record"
    WIRE_MEMBER: ClassVar[str] = "{what}.{name}"

    @classmethod
    def wire_fields(cls) -> tuple[tuple[Field[Any], Member], ...]:
        """Each wire member's field and metadata, in declaration order (a :class:`Part` is
        one field here; :meth:`wire_names` lists its members). Worked out once per class:
        every report and request on the call path decodes through it."""
        return _wire_fields(cast(type, cls))

    @classmethod
    def wire_names(cls, required: bool = False) -> tuple[str, ...]:
        """The names of the members on the wire, a part's in its place (``required``: only
        those a record must send); worked out once per class."""
        return _wire_names(cast(type, cls), required)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form (:meth:`from_wire` reads it back)."""
        out = {}
        for f, spec in self.wire_fields():
            value = getattr(self, f.name)
            if isinstance(spec.codec, Part):
                out.update(spec.codec.encode(value))
            elif not (spec.omit_default and _has_default(f) and value == _default(f)):
                out[f.name] = spec.codec.encode(value)
        return out

    @classmethod
    def from_wire(cls, data: Any, what: str | None = None) -> Self:
        """The record in ``data`` (:meth:`to_wire`'s form), every member checked and bounded
        (a missing optional one takes its default): ``ValueError`` for anything else."""
        what = cls.WIRE_NAME if what is None else what
        d = check_obj(data, what, cls.wire_names(), cls.wire_names(required=True))
        values = {}
        for f, spec in cls.wire_fields():
            if isinstance(spec.codec, Part):
                mine = _name_set(spec.codec.kind)
                values[f.name] = spec.codec.decode({k: v for k, v in d.items() if k in mine},
                                                   what)
            elif f.name in d:
                values[f.name] = spec.codec.decode(
                    d[f.name], cls.WIRE_MEMBER.format(what=what, name=f.name))
        return cast(Self, cast(Any, cls)(**values))


@functools.cache
def _wire_fields(cls: type) -> tuple[tuple[Field[Any], Member], ...]:
    return tuple((f, f.metadata["wire"]) for f in fields(cast(Any, cls)) if "wire" in f.metadata)


@functools.cache
def _wire_names(cls: type, required: bool) -> tuple[str, ...]:
    names: list[str] = []
    for f, spec in _wire_fields(cls):
        if isinstance(spec.codec, Part):
            names.extend(_wire_names(spec.codec.kind, required))
        elif not required or spec.required or not _has_default(f):
            names.append(f.name)
    return tuple(names)


@functools.cache
def _name_set(cls: type) -> frozenset[str]:
    return frozenset(_wire_names(cls, False))
