"""Benign Python keeps working in the restricted backend: each program with its exact stdout
(and, where it ends with an expression, its value)."""

from __future__ import annotations

import textwrap

import pytest

from sandboxd.models import Reason, Status
from tests.restricted.conftest import DEFAULT_IMPORTS, BackendHarness

PROGRAMS: list[tuple[str, str, str]] = [
    ("print", "print(1)", "1\n"),
    ("classes_attributes", """
        class Point:
            def __init__(self, x, y):
                self.x = x
                self.y = y
                self._norm = None
            def norm(self):
                if self._norm is None:
                    self._norm = (self.x ** 2 + self.y ** 2) ** 0.5
                return self._norm
            def __repr__(self):
                return f"Point({self.x}, {self.y})"
        p = Point(3, 4)
        p.x += 0
        print(p, p.norm())
        """, "Point(3, 4) 5.0\n"),
    ("super_and_inheritance", """
        class Animal:
            def __init__(self, name):
                self.name = name
            def speak(self):
                return "..."
        class Dog(Animal):
            def __init__(self, name):
                super().__init__(name)
                self.tricks = []
            def speak(self):
                return super().speak() + "woof"
        d = Dog("rex")
        d.tricks.append("sit")
        print(d.name, d.speak(), d.tricks, type(d).__name__)
        """, "rex ...woof ['sit'] Dog\n"),
    ("closures_nonlocal", """
        def counter():
            n = 0
            def inc():
                nonlocal n
                n += 1
                return n
            return inc
        c = counter()
        c(); c()
        print(c())
        """, "3\n"),
    ("generators", """
        def fib():
            a, b = 0, 1
            while True:
                yield a
                a, b = b, a + b
        g = fib()
        print([next(g) for _ in range(10)])
        print(sum(x * x for x in range(5)))
        """, "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n30\n"),
    ("decorators_wraps", """
        import functools
        def twice(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs) * 2
            return wrapper
        @twice
        def add(a, b):
            return a + b
        print(add(2, 3), add.__name__)
        """, "10 add\n"),
    ("comprehensions", """
        print([i * i for i in range(5) if i % 2 == 0])
        print({k: v for k, v in zip("abc", range(3))})
        print(sorted({c for c in "hello"}))
        """, "[0, 4, 16]\n{'a': 0, 'b': 1, 'c': 2}\n['e', 'h', 'l', 'o']\n"),
    ("fstrings_repr", """
        name = "Ada"
        n = 3.14159
        print(f"{name!r} {n:.2f} {n!s:>8} {[1, 2]!r}")
        """, "'Ada' 3.14  3.14159 [1, 2]\n"),
    ("dict_item_augassign", """
        counts = {}
        for word in "the cat and the hat and the bat".split():
            counts[word] = counts.get(word, 0)
            counts[word] += 1
        print(sorted(counts.items()))
        """, "[('and', 2), ('bat', 1), ('cat', 1), ('hat', 1), ('the', 3)]\n"),
    ("with_statement", """
        class Ctx:
            def __enter__(self):
                print("enter")
                return self
            def __exit__(self, *exc):
                print("exit")
                return False
        with Ctx() as c:
            print("body")
        """, "enter\nbody\nexit\n"),
    ("try_except_finally", """
        def f(x):
            try:
                return 10 / x
            except ZeroDivisionError as e:
                print("error:", e)
                return None
            finally:
                print("finally")
        print(f(2))
        print(f(0))
        """, "finally\n5.0\nerror: division by zero\nfinally\nNone\n"),
    ("str_format_plain_fields", """
        print("{} + {} = {}".format(1, 2, 3))
        print("{name} is {age}".format(name="Bob", age=42))
        print("{0[0]} {1:>4}".format([7], "x"))
        print("{a}".format_map({"a": 5}))
        """, "1 + 2 = 3\nBob is 42\n7    x\n5\n"),
    ("math_module", """
        import math
        print(math.sqrt(16), math.factorial(5), round(math.pi, 4), math.gcd(12, 18))
        """, "4.0 120 3.1416 6\n"),
    ("json_module", """
        import json
        data = json.loads('{"a": [1, 2, {"b": null}]}')
        data["c"] = True
        print(json.dumps(data, sort_keys=True))
        """, '{"a": [1, 2, {"b": null}], "c": true}\n'),
    ("re_module", """
        import re
        print(re.findall(r"\\d+", "a1b22c333"))
        m = re.match(r"(?P<word>\\w+) (\\w+)", "hello world")
        print(m.group("word"), m.group(2), re.sub(r"o", "0", "foo"))
        """, "['1', '22', '333']\nhello world f00\n"),
    ("datetime_module", """
        from datetime import date, datetime, timedelta
        d = date(2024, 2, 28) + timedelta(days=1)
        print(d.isoformat(), d.strftime("%A"))
        print(datetime.strptime("2024-03-01 12:30", "%Y-%m-%d %H:%M").hour)
        """, "2024-02-29 Thursday\n12\n"),
    ("collections_module", """
        from collections import Counter, defaultdict, deque, namedtuple, OrderedDict
        c = Counter("mississippi")
        print(c.most_common(2))
        dd = defaultdict(list)
        dd["a"].append(1)
        q = deque([1, 2, 3], maxlen=3)
        q.append(4)
        P = namedtuple("P", "x y")
        print(dict(dd), list(q), P(1, 2).y, list(OrderedDict(b=1, a=2)))
        """, "[('i', 4), ('s', 4)]\n{'a': [1]} [2, 3, 4] 2 ['b', 'a']\n"),
    ("itertools_functools", """
        import itertools, functools
        print(list(itertools.combinations("abc", 2)))
        print(functools.reduce(lambda a, b: a * b, range(1, 6)))
        @functools.lru_cache(maxsize=None)
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        print(fib(80), list(itertools.accumulate([1, 2, 3])))
        """, "[('a', 'b'), ('a', 'c'), ('b', 'c')]\n120\n23416728348467685 [1, 3, 6]\n"),
    ("statistics_module", """
        import statistics
        data = [2, 4, 4, 4, 5, 5, 7, 9]
        print(statistics.mean(data), statistics.median(data), statistics.pstdev(data))
        """, "5 4.5 2.0\n"),
    ("decimal_fractions", """
        from decimal import Decimal, getcontext
        from fractions import Fraction
        getcontext().prec = 6
        print(Decimal(1) / Decimal(7), Fraction(3, 4) + Fraction(1, 4), Fraction(1, 3) * 3)
        """, "0.142857 1 1\n"),
    ("random_seeded", """
        import random
        rng = random.Random(42)
        print(rng.randint(1, 100), rng.choice("abc"))
        random.seed(1)
        xs = [1, 2, 3, 4]
        random.shuffle(xs)
        print(sorted(xs))
        """, "82 a\n[1, 2, 3, 4]\n"),
    ("string_module", """
        import string
        print(string.ascii_lowercase[:5], string.capwords("hello world"))
        print(string.Template("$who likes $what").substitute(who="tim", what="pie"))
        """, "abcde Hello World\ntim likes pie\n"),
    ("workspace_files", """
        with open("notes.txt", "w") as f:
            f.write("line1\\nline2\\n")
        with open("notes.txt") as f:
            lines = f.read().splitlines()
        print(lines, len(open("notes.txt").readlines()))
        """, "['line1', 'line2'] 2\n"),
    ("class_attributes_and_properties", """
        class Account:
            count = 0
            def __init__(self, owner):
                Account.count += 1
                self.owner = owner
                self._balance = 0
            @property
            def balance(self):
                return self._balance
            def deposit(self, amount):
                self._balance += amount
                return self
            @staticmethod
            def bank():
                return "sandbank"
            @classmethod
            def total(cls):
                return cls.count
        a = Account("x").deposit(10).deposit(5)
        Account("y")
        print(a.balance, Account.total(), Account.bank())
        """, "15 2 sandbank\n"),
    ("exceptions_custom", """
        class MyError(ValueError):
            pass
        try:
            raise MyError("bad")
        except ValueError as e:
            print(type(e).__name__, e, isinstance(e, MyError))
        """, "MyError bad True\n"),
    ("unpacking_and_walrus", """
        first, *rest = [1, 2, 3, 4]
        (a, b), c = (5, 6), 7
        if (n := len(rest)) > 2:
            print(first, rest, a + b + c, n)
        for i, (x, y) in enumerate([(1, 2), (3, 4)]):
            print(i, x * y)
        """, "1 [2, 3, 4] 18 3\n0 2\n1 12\n"),
    ("main_guard", """
        def main():
            print("main ran")
        if __name__ == "__main__":
            main()
        """, "main ran\n"),
]


@pytest.mark.parametrize(("name", "code", "expected"), PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_benign_program(harness: BackendHarness, name: str, code: str, expected: str) -> None:
    res = harness.run(textwrap.dedent(code))
    assert res.stderr == "", res.stderr
    assert res.stdout == expected
    assert res.status is Status.ok, (res.message, res.stderr)
    assert res.termination.reason is Reason.exited
    assert res.termination.exit_code == 0
    assert res.cleanup.verified, res.cleanup.detail


def test_at_least_twenty_programs() -> None:
    assert len(PROGRAMS) >= 20


@pytest.mark.parametrize(
    ("code", "value"),
    [
        ("1 + 1", 2),
        ("{'a': [1, 2.5, None, True]}", {"a": [1, 2.5, None, True]}),
        ("(1, 'x')", [1, "x"]),
        ("{3, 1}", "{1, 3}"),
        ("float('nan')", "nan"),
        ("class A:\n    def __repr__(self):\n        return 'A!'\nA()", "A!"),
        ("x = 5", None),
        ("print('no value')", None),
    ],
)
def test_last_expression_value(harness: BackendHarness, code: str, value: object) -> None:
    res = harness.run(code)
    assert res.status is Status.ok, res.stderr
    assert res.value == value


EXTRA_IMPORTS = [
    "cmath", "calendar", "array", "unicodedata", "difflib", "numbers", "enum", "copy",
    "pprint", "base64", "binascii", "hashlib", "hmac", "uuid", "csv", "time", "heapq",
    "bisect", "textwrap", "operator",
]
EXTRA_PROGRAMS: list[tuple[str, str, str]] = [
    ("enum_class", """
        import enum
        class Color(enum.Enum):
            RED = 1
            GREEN = enum.auto()
        print(Color.RED, Color.GREEN.value, [c.name for c in Color])
        """, "Color.RED 2 ['RED', 'GREEN']\n"),
    ("csv_roundtrip", """
        import csv
        with open("t.csv", "w", newline="") as f:
            csv.writer(f).writerows([["a", "b"], [1, 2]])
        print(list(csv.DictReader(open("t.csv"))))
        """, "[{'a': '1', 'b': '2'}]\n"),
    ("pprint_and_copy", """
        import pprint, copy
        d = {"k": [1, 2]}
        e = copy.deepcopy(d)
        e["k"].append(3)
        pprint.pprint(d)
        print(e)
        """, "{'k': [1, 2]}\n{'k': [1, 2, 3]}\n"),
    ("hashes_and_encodings", """
        import hashlib, base64, binascii
        print(hashlib.sha256(b"abc").hexdigest()[:12], base64.b64encode(b"hi").decode(),
              binascii.hexlify(b"\\x01\\xff").decode())
        """, "ba7816bf8f01 aGk= 01ff\n"),
    ("annotations_and_heapq", """
        import heapq
        total: int = 0
        pending: list
        h: list = []
        for x in [5, 1, 4]:
            heapq.heappush(h, x)
            total += x
        def f(a: int, b: int = 2) -> int:
            return a * b
        print([heapq.heappop(h) for _ in range(3)], total, f(3))
        """, "[1, 4, 5] 10 6\n"),
    ("abc_numbers_subclass", """
        import numbers
        class Meters(numbers.Real):
            pass
        print(issubclass(Meters, numbers.Number))
        """, "True\n"),
]


@pytest.mark.parametrize(("name", "code", "expected"), EXTRA_PROGRAMS,
                         ids=[p[0] for p in EXTRA_PROGRAMS])
def test_more_modules(harness: BackendHarness, name: str, code: str, expected: str) -> None:
    res = harness.run(textwrap.dedent(code), imports=DEFAULT_IMPORTS + EXTRA_IMPORTS)
    assert res.stderr == "", res.stderr
    assert res.stdout == expected
    assert res.status is Status.ok


def test_policy_allowed_but_unsupported_module(harness: BackendHarness) -> None:
    res = harness.run("import typing", imports=["typing"])
    assert res.status is Status.error
    assert "not available in the restricted python backend" in res.stderr


def test_denylist_beats_allowlist(harness: BackendHarness) -> None:
    res = harness.run("import json", imports=["*"], deny=["json"])
    assert res.status is Status.error and "not allowed" in res.stderr
