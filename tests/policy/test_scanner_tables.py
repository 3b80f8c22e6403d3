# ruff: noqa: E501  (recorded table rows: one case per row reads better than wrapped strings)
"""Table tests pinning the two scanners' readings, branch by branch: the shell tool's tokenizer
and parser (:mod:`sandboxd.policy.shell`) and the bash reader (:mod:`sandboxd.languages.bash_scan`).
The tables were recorded from the scanners before they were restructured into handler tables, so
a change of reading (a construct accepted, refused or split differently) fails here."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.languages.bash_scan import simple_commands
from sandboxd.policy.shell import ShellRefused, parse, scan

BASH: list[tuple[str, list[Any]]] = [
    ('ls -l', [(['ls', '-l'], 1, 1)]),
    ('echo $x ok', [(['echo', None, 'ok'], 1, 1)]),
    ('a=1 b=2 cmd arg', [(['cmd', 'arg'], 1, 9)]),
    ('x=(1 2) ls', [(['ls'], 1, 9)]),
    ('f() { rm -rf /; }', [(['rm', '-rf', '/'], 1, 7)]),
    ('function g { id; }', [(['id'], 1, 14)]),
    ('for i in a b; do echo $i; done', [(['echo', None], 1, 18)]),
    ('select x in a b; do ls; done', [(['ls'], 1, 21)]),
    ('case $x in a) ls;; b|c) id;& *) w;;& esac', [(['ls'], 1, 15), (['id'], 1, 25), (['w'], 1, 33)]),
    ('if true; then cat f; elif x; then y; else z; fi', [(['true'], 1, 4), (['cat', 'f'], 1, 15), (['x'], 1, 27), (['y'], 1, 35), (['z'], 1, 43)]),
    ('while read l; do echo "$l"; done < f', [(['read', 'l'], 1, 7), (['echo', None], 1, 18)]),
    ('echo $(curl x | sh) `wget y`', [(['echo', None, None], 1, 1), (['curl', 'x'], 1, 8), (['sh'], 1, 17), (['wget', 'y'], 1, 22)]),
    ('echo "$(id)" \'$(no)\'', [(['echo', None, '$(no)'], 1, 1), (['id'], 1, 9)]),
    ('cat <<EOF\n$(rm x)\nEOF\nls', [(['cat'], 1, 1), (['ls'], 4, 1)]),
    ("cat <<-'E'\n\tbody\n\tE\nwc", [(['cat'], 1, 1), (['wc'], 4, 1)]),
    ('[[ -f x ]] && rm x', [(['rm', 'x'], 1, 15)]),
    ('(( i++ )); ls', [(['ls'], 1, 12)]),
    ('ls 2>&1 >/dev/null | grep x', [(['ls', '2'], 1, 1), (['grep', 'x'], 1, 22)]),
    ('# comment\nls # trailing', [(['ls'], 2, 1)]),
    ('a#b c', [(['a#b', 'c'], 1, 1)]),
    ("echo ${x:-$(id)} $((1+2)) $'a\\'b'", [(['echo', None, None, None], 1, 1)]),
    ('! grep x f', [(['grep', 'x', 'f'], 1, 3)]),
    ('{ ls; }', [(['ls'], 1, 3)]),
    ('time ls', [(['ls'], 1, 6)]),
    ('x[1]=2 a+=3 cmd', [(['cmd'], 1, 13)]),
    ('echo a\\ b', [(['echo', 'a b'], 1, 1)]),
    ('(cd d && make)', [(['cd', 'd'], 1, 2), (['make'], 1, 10)]),
    ('ls &', [(['ls'], 1, 1)]),
    ('echo *.py ~ {a,b} ?', [(['echo', None, None, None, None], 1, 1)]),
    ('"un', [(['un'], 1, 1)]),
    ('`un', [(['un'], 1, 2), ([None], 1, 1)]),
    ('$(un', [(['u'], 1, 3), ([None], 1, 1)]),
    ('coproc ls', [(['coproc', 'ls'], 1, 1)]),
    ('nested $(a $(b `c`))', [(['nested', None], 1, 1), (['a', None], 1, 10), (['b', None], 1, 14), (['c'], 1, 17)]),
    ('a\nb\n  c', [(['a'], 1, 1), (['b'], 2, 1), (['c'], 3, 3)]),
    ('ls >f 2>g <h', [(['ls', '2'], 1, 1)]),
    ('f () { x; }', [(['x'], 1, 8)]),
    ('x=1', []),
    ('exec 3>&1', [(['exec', '3'], 1, 1)]),
]
SHELL: list[tuple[str, bool, Any, Any]] = [
    ('ls', False, ('ok', [('word', 'ls', False)]), ('ok', [('always', [(['ls'], [])])])),
    ('ls', True, ('ok', [('word', 'ls', False)]), ('ok', [('always', [(['ls'], [])])])),
    ('a \'b c\' "d\\"e" f\\ g', False, ('ok', [('word', 'a', False), ('word', 'b c', True), ('word', 'd"e', True), ('word', 'f g', True)]), ('ok', [('always', [(['a', 'b c', 'd"e', 'f g'], [])])])),
    ('a \'b c\' "d\\"e" f\\ g', True, ('ok', [('word', 'a', False), ('word', 'b c', True), ('word', 'd"e', True), ('word', 'f g', True)]), ('ok', [('always', [(['a', 'b c', 'd"e', 'f g'], [])])])),
    ('x\\', False, ('ok', [('word', 'x\\', False)]), ('ok', [('always', [(['x\\'], [])])])),
    ('x\\', True, ('ok', [('word', 'x\\', False)]), ('ok', [('always', [(['x\\'], [])])])),
    ('a\\\nb', False, ('ok', [('word', 'ab', False)]), ('ok', [('always', [(['ab'], [])])])),
    ('a\\\nb', True, ('ok', [('word', 'ab', False)]), ('ok', [('always', [(['ab'], [])])])),
    ("'", False, ('refused', "'", 'The command line has an unterminated single quote'), ('refused', "'", 'The command line has an unterminated single quote')),
    ("'", True, ('refused', "'", 'The command line has an unterminated single quote'), ('refused', "'", 'The command line has an unterminated single quote')),
    ('"', False, ('refused', '"', 'The command line has an unterminated double quote'), ('refused', '"', 'The command line has an unterminated double quote')),
    ('"', True, ('refused', '"', 'The command line has an unterminated double quote'), ('refused', '"', 'The command line has an unterminated double quote')),
    ('"a`b"', False, ('refused', '`', 'Command substitution (backticks) is not allowed here'), ('refused', '`', 'Command substitution (backticks) is not allowed here')),
    ('"a`b"', True, ('refused', '`', 'Command substitution (backticks) is not allowed here'), ('refused', '`', 'Command substitution (backticks) is not allowed here')),
    ('"$(x)"', False, ('refused', '$(', 'Command substitution (`$(...)`) is not allowed here'), ('refused', '$(', 'Command substitution (`$(...)`) is not allowed here')),
    ('"$(x)"', True, ('refused', '$(', 'Command substitution (`$(...)`) is not allowed here'), ('refused', '$(', 'Command substitution (`$(...)`) is not allowed here')),
    ('"$((1))"', False, ('refused', '$((', 'Arithmetic expansion (`$((...))`) is not allowed here; write the number itself'), ('refused', '$((', 'Arithmetic expansion (`$((...))`) is not allowed here; write the number itself')),
    ('"$((1))"', True, ('refused', '$((', 'Arithmetic expansion (`$((...))`) is not allowed here; write the number itself'), ('refused', '$((', 'Arithmetic expansion (`$((...))`) is not allowed here; write the number itself')),
    ('"$x"', False, ('ok', [('word', '$x', True)]), ('ok', [('always', [(['$x'], [])])])),
    ('"$x"', True, ('refused', '$', '`$` expansions (variables such as `$HOME`, `${...}`, `$((...))`) are not performed here; write the value itself, or put `$` in single quotes to pass it literally'), ('refused', '$', '`$` expansions (variables such as `$HOME`, `${...}`, `$((...))`) are not performed here; write the value itself, or put `$` in single quotes to pass it literally')),
    ('$x', False, ('ok', [('word', '$x', False)]), ('ok', [('always', [(['$x'], [])])])),
    ('$x', True, ('refused', '$', '`$` expansions (variables such as `$HOME`, `${...}`, `$((...))`) are not performed here; write the value itself, or put `$` in single quotes to pass it literally'), ('refused', '$', '`$` expansions (variables such as `$HOME`, `${...}`, `$((...))`) are not performed here; write the value itself, or put `$` in single quotes to pass it literally')),
    ('`x`', False, ('refused', '`', 'Command substitution (backticks) is not allowed here'), ('refused', '`', 'Command substitution (backticks) is not allowed here')),
    ('`x`', True, ('refused', '`', 'Command substitution (backticks) is not allowed here'), ('refused', '`', 'Command substitution (backticks) is not allowed here')),
    ('ls 2>e 12>f', False, ('ok', [('word', 'ls', False), ('op', '2>', False), ('word', 'e', False), ('op', '12>', False), ('word', 'f', False)]), ('refused', '2>', 'Shell operators are not allowed here (found `2>`)')),
    ('ls 2>e 12>f', True, ('refused', '12>', '`12>`: descriptors above 9 are not supported (write `12 >` for an argument `12` followed by a redirect)'), ('refused', '12>', '`12>`: descriptors above 9 are not supported (write `12 >` for an argument `12` followed by a redirect)')),
    ('a|b&&c||d;e\nf', False, ('ok', [('word', 'a', False), ('op', '|', False), ('word', 'b', False), ('op', '&&', False), ('word', 'c', False), ('op', '||', False), ('word', 'd', False), ('op', ';', False), ('word', 'e', False), ('op', '\n', False), ('word', 'f', False)]), ('refused', '|', 'Shell operators are not allowed here (found `|`)')),
    ('a|b&&c||d;e\nf', True, ('ok', [('word', 'a', False), ('op', '|', False), ('word', 'b', False), ('op', '&&', False), ('word', 'c', False), ('op', '||', False), ('word', 'd', False), ('op', ';', False), ('word', 'e', False), ('op', '\n', False), ('word', 'f', False)]), ('ok', [('always', [(['a'], []), (['b'], [])]), ('ok', [(['c'], [])]), ('failed', [(['d'], [])]), ('always', [(['e'], [])]), ('always', [(['f'], [])])])),
    ('cat <(ls)', False, ('refused', '<(', 'Process substitution (`<(...)`) is not allowed here'), ('refused', '<(', 'Process substitution (`<(...)`) is not allowed here')),
    ('cat <(ls)', True, ('refused', '<(', 'Process substitution (`<(...)`) is not allowed here'), ('refused', '<(', 'Process substitution (`<(...)`) is not allowed here')),
    ('x >(y)', False, ('refused', '>(', 'Process substitution (`>(...)`) is not allowed here'), ('refused', '>(', 'Process substitution (`>(...)`) is not allowed here')),
    ('x >(y)', True, ('refused', '>(', 'Process substitution (`>(...)`) is not allowed here'), ('refused', '>(', 'Process substitution (`>(...)`) is not allowed here')),
    ('*', False, ('ok', [('word', '*', False)]), ('ok', [('always', [(['*'], [])])])),
    ('*', True, ('refused', '*', 'Globs (`*`) are not expanded here; name the files, or quote the word to pass `*` literally'), ('refused', '*', 'Globs (`*`) are not expanded here; name the files, or quote the word to pass `*` literally')),
    ('a?', False, ('ok', [('word', 'a?', False)]), ('ok', [('always', [(['a?'], [])])])),
    ('a?', True, ('refused', '?', 'Globs (`?`) are not expanded here; name the files, or quote the word to pass `?` literally'), ('refused', '?', 'Globs (`?`) are not expanded here; name the files, or quote the word to pass `?` literally')),
    ('[x]', False, ('ok', [('word', '[x]', False)]), ('ok', [('always', [(['[x]'], [])])])),
    ('[x]', True, ('refused', '[', 'Globs (`[`) are not expanded here; name the files, or quote the word to pass `[` literally'), ('refused', '[', 'Globs (`[`) are not expanded here; name the files, or quote the word to pass `[` literally')),
    ('{', False, ('ok', [('word', '{', False)]), ('ok', [('always', [(['{'], [])])])),
    ('{', True, ('refused', '{', 'Braces (`{`) are not supported here; quote them to pass them literally'), ('refused', '{', 'Braces (`{`) are not supported here; quote them to pass them literally')),
    ('}', False, ('ok', [('word', '}', False)]), ('ok', [('always', [(['}'], [])])])),
    ('}', True, ('refused', '}', 'Braces (`}`) are not supported here; quote them to pass them literally'), ('refused', '}', 'Braces (`}`) are not supported here; quote them to pass them literally')),
    ('#c', False, ('ok', [('word', '#c', False)]), ('ok', [('always', [(['#c'], [])])])),
    ('#c', True, ('refused', '#', 'Comments (`#`) are not supported here; remove the comment, or quote `#` to pass it literally'), ('refused', '#', 'Comments (`#`) are not supported here; remove the comment, or quote `#` to pass it literally')),
    ('a#b', False, ('ok', [('word', 'a#b', False)]), ('ok', [('always', [(['a#b'], [])])])),
    ('a#b', True, ('ok', [('word', 'a#b', False)]), ('ok', [('always', [(['a#b'], [])])])),
    ('~', False, ('ok', [('word', '~', False)]), ('ok', [('always', [(['~'], [])])])),
    ('~', True, ('refused', '~', '`~` is not expanded here; write the path (the workspace is the current directory)'), ('refused', '~', '`~` is not expanded here; write the path (the workspace is the current directory)')),
    ('a~', False, ('ok', [('word', 'a~', False)]), ('ok', [('always', [(['a~'], [])])])),
    ('a~', True, ('ok', [('word', 'a~', False)]), ('ok', [('always', [(['a~'], [])])])),
    ('"\\$x"', False, ('ok', [('word', '$x', True)]), ('ok', [('always', [(['$x'], [])])])),
    ('"\\$x"', True, ('ok', [('word', '$x', True)]), ('ok', [('always', [(['$x'], [])])])),
    ('ls >&2 <&-', False, ('ok', [('word', 'ls', False), ('op', '>&', False), ('word', '2', False), ('op', '<&', False), ('word', '-', False)]), ('refused', '>&', 'Shell operators are not allowed here (found `>&`)')),
    ('ls >&2 <&-', True, ('ok', [('word', 'ls', False), ('op', '>&', False), ('word', '2', False), ('op', '<&', False), ('word', '-', False)]), ('ok', [('always', [(['ls'], [(1, '>&', '2'), (0, '<&', '-')])])])),
    ('ls &>f', False, ('ok', [('word', 'ls', False), ('op', '&>', False), ('word', 'f', False)]), ('refused', '&>', 'Shell operators are not allowed here (found `&>`)')),
    ('ls &>f', True, ('ok', [('word', 'ls', False), ('op', '&>', False), ('word', 'f', False)]), ('refused', '&>', '`&>` is not supported here; write `>file 2>&1`')),
    ('if x', False, ('ok', [('word', 'if', False), ('word', 'x', False)]), ('ok', [('always', [(['if', 'x'], [])])])),
    ('if x', True, ('ok', [('word', 'if', False), ('word', 'x', False)]), ('refused', 'if', 'Shell keywords such as `if` are not supported here; run one program per command')),
    ("'if' x", False, ('ok', [('word', 'if', True), ('word', 'x', False)]), ('ok', [('always', [(['if', 'x'], [])])])),
    ("'if' x", True, ('ok', [('word', 'if', True), ('word', 'x', False)]), ('ok', [('always', [(['if', 'x'], [])])])),
    ('ls >', False, ('ok', [('word', 'ls', False), ('op', '>', False)]), ('refused', '>', 'Shell operators are not allowed here (found `>`)')),
    ('ls >', True, ('ok', [('word', 'ls', False), ('op', '>', False)]), ('refused', '>', '`>` needs a target')),
    ('ls | ', False, ('ok', [('word', 'ls', False), ('op', '|', False)]), ('refused', '|', 'Shell operators are not allowed here (found `|`)')),
    ('ls | ', True, ('ok', [('word', 'ls', False), ('op', '|', False)]), ('refused', '|', 'The command line ends with an operator')),
    ('; ls', False, ('ok', [('op', ';', False), ('word', 'ls', False)]), ('refused', ';', 'Shell operators are not allowed here (found `;`)')),
    ('; ls', True, ('ok', [('op', ';', False), ('word', 'ls', False)]), ('refused', ';', 'Syntax error near `;`')),
    ('\n\nls\n', False, ('ok', [('op', '\n', False), ('op', '\n', False), ('word', 'ls', False), ('op', '\n', False)]), ('refused', '\n', 'Shell operators are not allowed here (found `newline`)')),
    ('\n\nls\n', True, ('ok', [('op', '\n', False), ('op', '\n', False), ('word', 'ls', False), ('op', '\n', False)]), ('ok', [('always', [(['ls'], [])])])),
    ('ls &', False, ('ok', [('word', 'ls', False), ('op', '&', False)]), ('refused', '&', 'Shell operators are not allowed here (found `&`)')),
    ('ls &', True, ('ok', [('word', 'ls', False), ('op', '&', False)]), ('refused', '&', 'Background jobs (`&`) are not supported here')),
    ('(ls)', False, ('ok', [('op', '(', False), ('word', 'ls', False), ('op', ')', False)]), ('refused', '(', 'Shell operators are not allowed here (found `(`)')),
    ('(ls)', True, ('ok', [('op', '(', False), ('word', 'ls', False), ('op', ')', False)]), ('refused', '(', 'Subshells (`(...)`) are not supported here')),
    ('ls <<E', False, ('ok', [('word', 'ls', False), ('op', '<<', False), ('word', 'E', False)]), ('refused', '<<', 'Shell operators are not allowed here (found `<<`)')),
    ('ls <<E', True, ('ok', [('word', 'ls', False), ('op', '<<', False), ('word', 'E', False)]), ('refused', '<<', 'Here-documents (`<<`) are not supported here; write the text to a file (write_file) and redirect it with `<`')),
    ('ls >& x', False, ('ok', [('word', 'ls', False), ('op', '>&', False), ('word', 'x', False)]), ('refused', '>&', 'Shell operators are not allowed here (found `>&`)')),
    ('ls >& x', True, ('ok', [('word', 'ls', False), ('op', '>&', False), ('word', 'x', False)]), ('refused', '>&', '`>&` must be followed by a descriptor 0-9 or `-`')),
    ('2>f', False, ('ok', [('op', '2>', False), ('word', 'f', False)]), ('refused', '2>', 'Shell operators are not allowed here (found `2>`)')),
    ('2>f', True, ('ok', [('op', '2>', False), ('word', 'f', False)]), ('refused', '>', 'A redirect needs a command (write `cmd > file`)')),
    ('ls ;; x', False, ('ok', [('word', 'ls', False), ('op', ';;', False), ('word', 'x', False)]), ('refused', ';;', 'Shell operators are not allowed here (found `;;`)')),
    ('ls ;; x', True, ('ok', [('word', 'ls', False), ('op', ';;', False), ('word', 'x', False)]), ('refused', ';;', '`;;` is not supported here')),
    ('ls |& x', False, ('ok', [('word', 'ls', False), ('op', '|&', False), ('word', 'x', False)]), ('refused', '|&', 'Shell operators are not allowed here (found `|&`)')),
    ('ls |& x', True, ('ok', [('word', 'ls', False), ('op', '|&', False), ('word', 'x', False)]), ('refused', '|&', '`|&` is not supported here; write `2>&1 |`')),
    ('ls ²> x', False, ('ok', [('word', 'ls', False), ('word', '²', False), ('op', '>', False), ('word', 'x', False)]), ('refused', '>', 'Shell operators are not allowed here (found `>`)')),
    ('ls ²> x', True, ('ok', [('word', 'ls', False), ('word', '²', False), ('op', '>', False), ('word', 'x', False)]), ('ok', [('always', [(['ls', '²'], [(1, '>', 'x')])])])),
    ('ls 1>>f 0<>g 1>|h', False, ('ok', [('word', 'ls', False), ('op', '1>>', False), ('word', 'f', False), ('op', '0<>', False), ('word', 'g', False), ('op', '1>|', False), ('word', 'h', False)]), ('refused', '1>>', 'Shell operators are not allowed here (found `1>>`)')),
    ('ls 1>>f 0<>g 1>|h', True, ('ok', [('word', 'ls', False), ('op', '1>>', False), ('word', 'f', False), ('op', '0<>', False), ('word', 'g', False), ('op', '1>|', False), ('word', 'h', False)]), ('ok', [('always', [(['ls'], [(1, '>>', 'f'), (0, '<>', 'g'), (1, '>|', 'h')])])])),
]


@pytest.mark.parametrize(("code", "expected"), BASH)
def test_bash_reader_table(code: str, expected: list[Any]) -> None:
    found = [(s.words, s.line, s.column) for s in simple_commands(code)]
    assert found == expected


def _outcome(fn: Any, line: str, operators: bool) -> Any:
    try:
        return ("ok", fn(line, operators=operators))
    except ShellRefused as e:
        return ("refused", e.construct, str(e))


@pytest.mark.parametrize(("line", "operators", "tokens", "pipelines"), SHELL)
def test_shell_scan_and_parse_table(
    line: str, operators: bool, tokens: Any, pipelines: Any
) -> None:
    got = _outcome(scan, line, operators)
    if got[0] == "ok":
        got = ("ok", [(t.kind, t.text, t.quoted) for t in got[1]])
    assert got == tokens
    got = _outcome(parse, line, operators)
    if got[0] == "ok":
        got = (
            "ok",
            [
                (
                    p.run_if,
                    [(c.argv, [(r.fd, r.op, r.target) for r in c.redirects]) for c in p.commands],
                )
                for p in got[1]
            ],
        )
    assert got == pipelines
