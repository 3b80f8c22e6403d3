"""The modules user code may import and the names each module proxy exposes."""

from __future__ import annotations

import array
import base64
import binascii
import bisect
import calendar
import cmath
import collections
import copy
import csv
import datetime
import decimal
import difflib
import enum
import fractions
import functools
import hashlib
import heapq
import hmac
import itertools
import json
import math
import numbers
import operator
import pprint
import random
import re
import statistics
import string
import struct
import textwrap
import time
import types
import unicodedata
import uuid

from sandboxd.backends.restricted.offered import OFFERED_MODULES


def _public(module: types.ModuleType, *exclude: str) -> frozenset[str]:
    """Public names of a C/leaf module whose values are not modules."""
    return frozenset(
        n
        for n in dir(module)
        if not n.startswith("_")
        and n not in exclude
        and not isinstance(getattr(module, n), types.ModuleType)
    )


def _module_table() -> dict[str, tuple[types.ModuleType, frozenset[str]]]:
    """Supported modules and the names each proxy exposes (computed once in the zygote)."""
    table: dict[str, tuple[types.ModuleType, frozenset[str]]] = {
        "math": (math, _public(math)),
        "json": (
            json,
            frozenset(
                ["dumps", "loads", "dump", "load", "JSONDecodeError", "JSONEncoder", "JSONDecoder"]
            ),
        ),
        "re": (
            re,
            frozenset(
                [
                    "compile",
                    "search",
                    "match",
                    "fullmatch",
                    "split",
                    "findall",
                    "finditer",
                    "sub",
                    "subn",
                    "escape",
                    "error",
                    "Pattern",
                    "Match",
                    "RegexFlag",
                    "A",
                    "ASCII",
                    "I",
                    "IGNORECASE",
                    "M",
                    "MULTILINE",
                    "S",
                    "DOTALL",
                    "X",
                    "VERBOSE",
                    "U",
                    "UNICODE",
                    "NOFLAG",
                ]
            )
            & frozenset(dir(re)),
        ),
        "datetime": (
            datetime,
            frozenset(
                [
                    "date",
                    "datetime",
                    "time",
                    "timedelta",
                    "timezone",
                    "tzinfo",
                    "MINYEAR",
                    "MAXYEAR",
                    "UTC",
                ]
            )
            & frozenset(dir(datetime)),
        ),
        "statistics": (
            statistics,
            frozenset(
                [
                    "mean",
                    "fmean",
                    "geometric_mean",
                    "harmonic_mean",
                    "median",
                    "median_low",
                    "median_high",
                    "median_grouped",
                    "mode",
                    "multimode",
                    "pstdev",
                    "pvariance",
                    "stdev",
                    "variance",
                    "quantiles",
                    "NormalDist",
                    "StatisticsError",
                    "correlation",
                    "covariance",
                    "linear_regression",
                ]
            )
            & frozenset(dir(statistics)),
        ),
        "itertools": (itertools, _public(itertools)),
        "functools": (
            functools,
            frozenset(
                [
                    "reduce",
                    "partial",
                    "partialmethod",
                    "lru_cache",
                    "cache",
                    "cached_property",
                    "wraps",
                    "update_wrapper",
                    "total_ordering",
                    "cmp_to_key",
                    "singledispatch",
                    "WRAPPER_ASSIGNMENTS",
                    "WRAPPER_UPDATES",
                ]
            ),
        ),
        "collections": (
            collections,
            frozenset(
                [
                    "namedtuple",
                    "deque",
                    "Counter",
                    "OrderedDict",
                    "defaultdict",
                    "ChainMap",
                    "UserDict",
                    "UserList",
                    "UserString",
                ]
            ),
        ),
        "random": (
            random,
            frozenset(
                [
                    "random",
                    "randint",
                    "randrange",
                    "choice",
                    "choices",
                    "shuffle",
                    "sample",
                    "uniform",
                    "triangular",
                    "gauss",
                    "normalvariate",
                    "lognormvariate",
                    "expovariate",
                    "vonmisesvariate",
                    "gammavariate",
                    "betavariate",
                    "paretovariate",
                    "weibullvariate",
                    "seed",
                    "getrandbits",
                    "randbytes",
                    "Random",
                    "SystemRandom",
                ]
            )
            & frozenset(dir(random)),
        ),
        "string": (
            string,
            frozenset(
                [
                    "ascii_letters",
                    "ascii_lowercase",
                    "ascii_uppercase",
                    "digits",
                    "hexdigits",
                    "octdigits",
                    "punctuation",
                    "printable",
                    "whitespace",
                    "capwords",
                    "Template",
                ]
            ),
        ),
        "decimal": (decimal, _public(decimal)),
        "fractions": (fractions, frozenset(("Fraction",))),
        "heapq": (
            heapq,
            frozenset(
                [
                    "heappush",
                    "heappop",
                    "heapify",
                    "heapreplace",
                    "heappushpop",
                    "nlargest",
                    "nsmallest",
                    "merge",
                ]
            ),
        ),
        "bisect": (
            bisect,
            frozenset(
                ["bisect", "bisect_left", "bisect_right", "insort", "insort_left", "insort_right"]
            ),
        ),
        "textwrap": (textwrap, frozenset(["wrap", "fill", "dedent", "indent", "shorten"])),
        "time": (
            time,
            frozenset(
                [
                    "time",
                    "time_ns",
                    "monotonic",
                    "monotonic_ns",
                    "perf_counter",
                    "perf_counter_ns",
                    "process_time",
                    "sleep",
                    "strftime",
                    "gmtime",
                    "localtime",
                    "mktime",
                    "asctime",
                    "ctime",
                    "struct_time",
                ]
            ),
        ),
        "operator": (operator, _public(operator, "attrgetter", "methodcaller")),
        "struct": (struct, frozenset(["pack", "unpack", "calcsize", "iter_unpack", "error"])),
        "cmath": (cmath, _public(cmath)),
        "calendar": (
            calendar,
            frozenset(
                [
                    "isleap",
                    "leapdays",
                    "monthrange",
                    "month",
                    "calendar",
                    "weekday",
                    "monthcalendar",
                    "month_name",
                    "day_name",
                    "month_abbr",
                    "day_abbr",
                    "Calendar",
                    "TextCalendar",
                    "MONDAY",
                    "TUESDAY",
                    "WEDNESDAY",
                    "THURSDAY",
                    "FRIDAY",
                    "SATURDAY",
                    "SUNDAY",
                    "timegm",
                ]
            )
            & frozenset(dir(calendar)),
        ),
        "array": (array, frozenset(["array", "typecodes"])),
        "unicodedata": (unicodedata, _public(unicodedata)),
        "difflib": (
            difflib,
            frozenset(
                [
                    "SequenceMatcher",
                    "Differ",
                    "unified_diff",
                    "context_diff",
                    "ndiff",
                    "get_close_matches",
                    "restore",
                    "IS_CHARACTER_JUNK",
                    "IS_LINE_JUNK",
                ]
            ),
        ),
        "numbers": (numbers, frozenset(["Number", "Complex", "Real", "Rational", "Integral"])),
        "enum": (
            enum,
            frozenset(["Enum", "IntEnum", "Flag", "IntFlag", "StrEnum", "auto", "unique"])
            & frozenset(dir(enum)),
        ),
        "copy": (copy, frozenset(["copy", "deepcopy", "Error"])),
        "pprint": (pprint, frozenset(["pformat", "pp", "pprint", "isreadable", "saferepr"])),
        "base64": (
            base64,
            frozenset(
                [
                    "b64encode",
                    "b64decode",
                    "urlsafe_b64encode",
                    "urlsafe_b64decode",
                    "standard_b64encode",
                    "standard_b64decode",
                    "b32encode",
                    "b32decode",
                    "b16encode",
                    "b16decode",
                    "a85encode",
                    "a85decode",
                    "b85encode",
                    "b85decode",
                    "encodebytes",
                    "decodebytes",
                ]
            ),
        ),
        "binascii": (
            binascii,
            frozenset(
                [
                    "hexlify",
                    "unhexlify",
                    "b2a_hex",
                    "a2b_hex",
                    "b2a_base64",
                    "a2b_base64",
                    "crc32",
                    "crc_hqx",
                    "Error",
                    "Incomplete",
                ]
            ),
        ),
        "hashlib": (
            hashlib,
            frozenset(
                [
                    "md5",
                    "sha1",
                    "sha224",
                    "sha256",
                    "sha384",
                    "sha512",
                    "sha3_224",
                    "sha3_256",
                    "sha3_384",
                    "sha3_512",
                    "blake2b",
                    "blake2s",
                    "shake_128",
                    "shake_256",
                    "new",
                    "algorithms_guaranteed",
                ]
            ),
        ),
        "hmac": (hmac, frozenset(["new", "compare_digest", "digest", "HMAC"])),
        "uuid": (
            uuid,
            frozenset(
                [
                    "UUID",
                    "uuid3",
                    "uuid4",
                    "uuid5",
                    "NAMESPACE_DNS",
                    "NAMESPACE_URL",
                    "NAMESPACE_OID",
                    "NAMESPACE_X500",
                ]
            ),
        ),
        "csv": (
            csv,
            frozenset(
                [
                    "reader",
                    "writer",
                    "DictReader",
                    "DictWriter",
                    "Dialect",
                    "excel",
                    "excel_tab",
                    "unix_dialect",
                    "Sniffer",
                    "Error",
                    "QUOTE_ALL",
                    "QUOTE_MINIMAL",
                    "QUOTE_NONE",
                    "QUOTE_NONNUMERIC",
                ]
            ),
        ),
    }
    if set(table) != OFFERED_MODULES:  # the daemon's policy checks read that list
        raise RuntimeError(f"offered.OFFERED_MODULES is not the table: {sorted(table)}")
    return table


MODULES = _module_table()
