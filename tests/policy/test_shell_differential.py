"""Differential tests against the real /bin/sh: what the policy checks is what runs.

With ``operators: true`` a line is parsed once (:mod:`sandboxd.policy.shell`), checked, and
the parsed structure (a plan) is executed by the container runner's own executor - no shell.
For every line the policy accepts, that executor must do exactly what ``/bin/sh -c line``
does: the same programs with the same arguments, the same output, exit status and files. For
the lines on which a POSIX tokenizer and /bin/sh disagree (each is a way to run what the
policy never saw), the policy must
refuse. Without operators the argv the backend runs must be the argv sh would have built.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxd.policy import PolicyStore
from tests.policy.helpers import decide, store_for
from tests.support.plan import execute

ALLOWED = ["ls", "cat", "wc", "sort", "grep"]
DECOYS = ["curl", "lscurl", "sh", "bash", "rm", "env", "x", "l", "s", "cu", "rl", "id"]

RULES = """\
tools:
  shell:
    commands: {{allow: [{allow}], deny: [curl]}}
    operators: {operators}
"""
# each stub logs its name and arguments (US-separated, RS-terminated), prints them, and exits
# 0 - except grep, which fails like a search without a match (so that || and && both matter)
STUB = """#!/bin/sh
rec={name}; for a; do rec="$rec\x1f$a"; done
printf '%s\\036' "$rec" >> "$RAN_LOG"  # one write: concurrent stubs do not interleave
echo {name} "$@"
exit {status}
"""


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stubs")
    for name in ALLOWED + DECOYS:
        stub = d / name
        stub.write_text(STUB.format(name=name, status=1 if name == "grep" else 0))
        stub.chmod(0o755)
    dump = d / "dump"
    dump.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    dump.chmod(0o755)
    return d


def _state(cwd: Path, log: Path) -> tuple[list[str], dict[str, bytes]]:
    ran = sorted(log.read_text().split("\x1e")[:-1]) if log.exists() else []
    files = {p.name: p.read_bytes() for p in cwd.iterdir()}
    return ran, files


def both(stubs: Path, line: str, plan: object, tmp: Path) -> tuple[tuple, tuple]:
    """What /bin/sh and the plan executor did: (status, stdout, programs run, files)."""
    results = []
    for who in ("sh", "plan"):
        cwd = tmp / who
        cwd.mkdir(parents=True)
        log = tmp / f"{who}.log"
        env = {"PATH": str(stubs), "RAN_LOG": str(log), "LANG": "C.UTF-8"}
        if who == "sh":
            r = subprocess.run(["/bin/sh", "-c", line], cwd=cwd, capture_output=True,
                               timeout=20, env=env, stdin=subprocess.DEVNULL)
            status, out = r.returncode, r.stdout
        else:
            status, out, _ = execute(plan, cwd, env)  # type: ignore[arg-type]
        results.append((status, out, *_state(cwd, log)))
    return results[0], results[1]


CORPUS = [
    "ls | wc -l", "ls; cat x", "ls && cat x || grep y z", "ls > out 2>&1; cat out | sort",
    "ls\ncat b", "ls 'a;curl'", "c\\url", "ls # ; curl", "ls;curl", "ls|curl", "ls>x curl",
    "cat <x", "l\\s", '"ls"', "'l's", "ls ;; curl", "ls\\\ncurl", "ls &&\ncurl", "cu''rl x",
    "ls | { curl; }", "ls || ! curl", "ls 2>&1 | cat", "ls > 'x y'", "ls >x; l\\\ns",
    "ls $(curl)", "ls `curl`", "ls & curl", "(curl)", "ls\n\n\ncat", "ls ; ; cat",
    "grep a || ls && cat", "grep a && ls || cat; wc", "ls >a 2>b; cat a b >>c; sort <c",
    "ls 1>&2 2>/dev/null | wc", "ls 2>&1 >f | cat", "ls 3>f >&3; cat f", "cat <>f",
    "ls |\n sort", "ls ;\n cat", "ls >|f", "ls a#b", "ls ''#b", "ls '$HOME' \"x'y\"",
    "ls 'a\nb' c\\ d", "ls >f 2>&1 && cat f", "wc 0<f", "ls 9>f", "ls 2>&-",
]


def fuzz_lines(n: int, seed: int) -> list[str]:
    """Token soup: mostly refused, which exercises every refusal path."""
    vocab = ["ls", "cat", "curl", "wc", "|", ";", "&&", "||", ">", "<", "2>&1", "'", '"',
             "\\", "\n", " ", " ", " ", "x", "#", "&", "$", "(", ")", "`", "c'u'rl", "{", "}",
             "=", "l", "s", "cu", "rl", "*", "?", "!", "-n"]
    rng = random.Random(seed)
    return ["".join(rng.choice(vocab) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def grammar_lines(n: int, seed: int) -> list[str]:
    """Lines built from the constructs the parser models (quoting of every kind, operators,
    line breaks, redirects and descriptor copies), with now and then one it does not."""
    programs = ["ls", "cat", "wc", "sort", "grep", "l\\s", "'cat'", '"wc"', "c''at", "curl",
                "id", "so\\\nrt"]
    words = ["x", "f", "-n", "'a b'", '"c d"', "e\\ f", "'#'", "a#b", "''", '""', "'$x'",
             '"x\'y"', "\\;", "'|'", "\\&", "'*'", "\\*", '"\\$"', "'a\nb'", "=", "a=b",
             "é", "\\\\", '"\\\\"', "'\\'", "--", "\\#", "x\\\ny", "'~'", "\\~"]
    redirects = [" > {f}", " >> {f}", " < {f}", " 2>&1", " 2>/dev/null", " >&2", " 1>&2",
                 " 3>{f}", " <>{f}", " 2>{g}", " >|{f}", " >'a {f}'", " 2>&-", " 0<{f}",
                 " >{f} 2>&1", " 9>{g} >&9"]
    operators = [" | ", "; ", " && ", " || ", "\n", " |\n", " &&\n ", ";", " ;\n\n"]
    hostile = ["#", "$x", "${x}", "`id`", "$(id)", "*", "&", "(", "{", "~", "!", "[a]",
               "<<E", "&>", "|&", ";;", "12>f"]
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        parts = []
        count = rng.randint(1, 4)
        ops = [rng.choice(operators) for _ in range(count - 1)]
        for c in range(count):
            if c:
                parts.append(ops[c - 1])
            parts.append(rng.choice(programs))
            for _ in range(rng.randint(0, 3)):
                parts.append(" " + rng.choice(words))
            if rng.random() < 0.4:
                # commands of one pipeline run at once: never let them write the same file
                piped = "|" in "".join(ops[max(c - 1, 0):c + 1])
                names = {"f": f"f{c}", "g": f"g{c}"} if piped else {"f": "f", "g": "g"}
                parts.append(rng.choice(redirects).format(**names))
        if rng.random() < 0.15:
            parts.insert(rng.randrange(len(parts) + 1), " " + rng.choice(hostile))
        lines.append("".join(parts))
    return lines


@pytest.mark.parametrize("operators", ["true", "false"])
@pytest.mark.parametrize(("lines", "least"), [
    (CORPUS + fuzz_lines(600, seed=20261121), (20, 10)),
    (grammar_lines(700, seed=20261123), (300, 40)),
], ids=["soup", "grammar"])
def test_what_is_checked_is_what_runs(tmp_path: Path, stubs: Path, operators: str,
                                      lines: list[str], least: tuple[int, int]) -> None:
    store = store_for(tmp_path, RULES.format(allow=", ".join(ALLOWED), operators=operators))
    allowed_lines = 0
    for k, line in enumerate(lines):
        d = decide(store, "shell", {"command": line})
        if not d.allowed:
            assert d.message
            continue
        allowed_lines += 1
        assert d.plan is not None
        if operators == "false":
            # without operators the backend runs argv directly; the program is argv[0]
            assert d.plan.argv is not None
            assert os.path.basename(d.plan.argv[0]) in ALLOWED
            continue
        assert d.plan.command is not None
        sh, ours = both(stubs, line, d.plan.command, tmp_path / str(k))
        assert ours == sh, f"{line!r}: sh did {sh}, the plan did {ours}"
        outside = [r.split("\x1f")[0] for r in sh[2] if r.split("\x1f")[0] not in ALLOWED]
        assert not outside, f"{line!r} was allowed ({d.rule}) but sh ran {outside}"
    assert allowed_lines > least[operators == "false"], allowed_lines  # really exercised


# Lines a tokenizer that does not model every rule of sh reads as one allowed command while
# /bin/sh runs several (a command the policy never checked), and variants: all refused with
# operators on.
ATTACKS = [
    "cat #'\nid\n#'",
    "ls #'\nid\n#'",
    "cat \"${x#\"'\"}\"; id #'",
    "cat \"${x%\"'\"}\"; id #'",
    "cat ${x:-'}; id #'",
    "ls #\\\nid",
    "ls $(id)", "ls \"$(id)\"", "ls `id`", "ls \"`id`\"", "ls $((1))",
    "ls $IFS id", "cat ${IFS}x; id", "ls; ${CMD}", "ls | $0 -c id",
    "ls & id", "(id)", "ls || (id)", "{ id; }", "ls; ! id",
    "cat <<E\nx\nE\nid", "cat <<<'x'; id", "ls |& id", "ls &>x; id",
    "if ls; then id; fi", "for x in ls; do id; done", "case x in x) id;; esac",
    "ls *", "ls ?d", "ls [i]d", "~/id", "ls ~",
]


def test_attack_lines_are_refused(tmp_path: Path, stubs: Path) -> None:
    store = store_for(tmp_path, RULES.format(allow=", ".join(ALLOWED), operators="true"))
    ran_something_else = 0
    for k, line in enumerate(ATTACKS):
        d = decide(store, "shell", {"command": line})
        assert not d.allowed, f"{line!r} was allowed: {d.plan}"
        assert d.rule in ("tools.shell.operators", "tools.shell.commands.allow"), (line, d.rule)
        assert "not" in d.message, d.message
        # evidence that these lines matter: sh runs a program a naive reading would not see
        cwd = tmp_path / str(k)
        cwd.mkdir()
        log = tmp_path / f"{k}.log"
        (cwd / "id").write_text("")  # so that globs have something to match
        subprocess.run(["/bin/sh", "-c", line], cwd=cwd, capture_output=True, timeout=20,
                       env={"PATH": str(stubs), "RAN_LOG": str(log), "HOME": str(cwd),
                            "CMD": "id"}, stdin=subprocess.DEVNULL)
        ran = _state(cwd, log)[0]
        if any(r.split("\x1f")[0] == "id" for r in ran):
            ran_something_else += 1
    assert ran_something_else >= 20


# real programs: the executor's output equals sh's for accepted lines
REAL = [
    "seq 5 | sort -r | head -n 2",
    "printf 'b\\na\\nc\\n' > f; sort f | tr a-z A-Z; wc -l < f",
    "printf 'x\\n' > f && cat f f >> g; cat g | wc -l",
    "false || echo one && echo two; true && false || echo three",
    "cat missing 2>/dev/null || echo missing; echo after",
    "cat missing; echo status-kept",
    "seq 3 > out 2>&1; cat < out; cat 0<out | head -n 1",
    "echo to-stderr 1>&2 | wc -c",
    "echo a >f; echo b >>f; grep -c . f; grep zzz f || echo nomatch",
    "seq 10 | grep 1 | wc -l",
    "echo 'quoted; | && text' 'and $ too' 'a#b' \"x\\\"y\"",
    "echo x 2>&1 >f | cat; cat f",
    "echo one >f; cat <>f",
    "yes | head -n 3",
    "echo a 3>f >&3; cat f",
    "echo gone 1>&-; echo st",
    "ls nosuchdir; echo st",
    "echo a | cat | cat | cat",
]


@pytest.mark.parametrize("line", REAL)
def test_accepted_lines_do_what_sh_does(tmp_path: Path, line: str) -> None:
    progs = ["seq", "sort", "head", "printf", "tr", "wc", "cat", "echo", "true", "false",
             "grep", "yes", "ls"]
    store = store_for(tmp_path, RULES.format(allow=", ".join(json.dumps(p) for p in progs),
                                             operators="true"))
    d = decide(store, "shell", {"command": line})
    assert d.allowed and d.plan is not None, d.message
    results = []
    for who in ("sh", "plan"):
        cwd = tmp_path / who
        cwd.mkdir()
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if who == "sh":
            r = subprocess.run(["/bin/sh", "-c", line], cwd=cwd, capture_output=True,
                               timeout=20, env=env, stdin=subprocess.DEVNULL)
            status, out, err = r.returncode, r.stdout, r.stderr
        else:
            assert d.plan.command is not None
            status, out, err = execute(d.plan.command, cwd, env)
        files = {p.name: p.read_bytes() for p in cwd.iterdir()}
        results.append((status, out, files, bool(err)))
    assert results[1] == results[0], line


WORDS = ["a", "'b c'", '"d e"', "f\\ g", "'h'\"i\"j", "\\'", '"\\""', "''", '""', "k\\\\l",
         '"m\\n"', "'n\\'", "--o=p", "q=r", "#", "s#t", "é", '"\\$"']


def test_argv_matches_the_shell_quote_removal(tmp_path: Path, stubs: Path) -> None:
    store: PolicyStore = store_for(tmp_path, RULES.format(allow="dump", operators="false"))
    rng = random.Random(7)
    lines = [" ".join(["dump", *rng.sample(WORDS, rng.randint(1, 6))]) for _ in range(150)]
    for line in lines:
        d = decide(store, "shell", {"command": line})
        assert d.allowed, (line, d.message)
        assert d.plan.argv is not None
        r = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, timeout=20,
                           env={"PATH": str(stubs)}, cwd=tmp_path)
        if r.stdout.strip() == "":
            # '#' starts a comment in sh: the shell drops the rest, the policy keeps it as
            # literal arguments (harmless: no program is hidden behind it, and no shell runs)
            assert "#" in line
            continue
        expected = json.loads(r.stdout)
        if "#" in line and expected != d.plan.argv[1:]:
            assert d.plan.argv[1:len(expected) + 1] == expected
            continue
        assert d.plan.argv[1:] == expected, line
