"""Matching tool arguments against the globs of approval rules: narrowly where a rule allows, widely
where it denies or asks.

An *allow* rule such as `{"command": "git status*"}` is meant to allow `git status --short`, never
`git status; rm -rf ~`. So a value is not matched as raw text: it is cut at every shell control
sequence into a structure of plain-text words and operators, and so is the pattern. The two must
have the same operators in the same places, and each plain-text piece of the value must match the
pattern's piece in the same place. A wildcard only ever stands for plain text: it cannot cover an
operator even when the pattern spells one out elsewhere (`cd /tmp && ls*` does not allow
`cd /tmp && ls && touch x`), nor a character that makes a shell expand or re-read text (`$`, backslashes,
quotes, parentheses, braces: bash runs `echo ${x@P}` tricks without any `$(`), nor a JSON string's
quote (`["docs/*"]` does not allow `["docs/a","/etc/passwd"]`). Those must be spelled out literally.

Nor does a wildcard cover a `#` that starts a word: the shell reads the rest of the line as a comment,
so `git push * --dry-run` must not allow `git push origin main # --dry-run`, a real push.

A *deny* or *ask* rule must not be that easy to step around: `rm *` denies `true; rm -rf /`,
`rm -rf / 2>/dev/null`, `/bin/rm -rf /`, `timeout 5 nice rm -rf /` and `rm<TAB>-rf /` too. It covers
a value if it matches the whole text, any piece between operators, or any simple command as the
shell would run it (server/tools/shell_words.py: program paths reduced to names, wrappers such as
`sudo`, `env`, `nice`, `timeout` looked through with their options). A command that reading cannot
see into (`sh -c`, `xargs`, `find -delete`, `python -c`, `$cmd`, a quoted program name, a
here-document…) is covered by every deny and ask rule. And where a value may still hide what it
runs (`$`, backslashes, quotes), `may_cover` says a deny or ask rule for that argument might apply,
so the call goes to a person rather than being allowed. Deny rules are a guard; the sandbox is the
boundary.

Quoting is deliberately ignored: `$(…)` and backticks run inside double quotes too, and treating a
quoted `;` as an operator only makes an allow rule stricter, never wider.
"""
from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from . import shell_words

# Longest first, so that `&&` is one operator, not two `&`.
CONTROL_SEQUENCES = ("&&", "||", ";;", "|&", ">>", "<<", "$(", ";", "&", "|", "`", "\n", "\r", ">", "<")
_SPLIT = re.compile("(" + "|".join(re.escape(seq) for seq in CONTROL_SEQUENCES) + ")")


def structure(text: str) -> list[str]:
    """`text` cut into plain pieces and control operators: [plain, op, plain, op, …, plain]."""
    return _SPLIT.split(text)


def operators(text: str) -> list[str]:
    """The control operators of `text`, in order."""
    return structure(text)[1::2]


# What a wildcard of an allow rule never stands for: they make a shell expand, re-read or group text,
# or end a JSON string.
LITERAL_ONLY = "$\\'\"(){}`"
# Nor a `#` that starts a word (a comment): only one after a non-blank character is plain text.
_PLAIN = "(?:[^#" + re.escape(LITERAL_ONLY) + "]|(?<=\\S)#)"
# What may still make a value hide what it runs from a deny or ask rule's pattern, once parsed.
_OBSCURING = re.compile(r"[$\\'\"`]")
_PREFIX = re.compile(r"^(?:\s|[({!]|\w+=\S*\s)*")


@lru_cache(maxsize=2048)
def _strict(piece: str) -> re.Pattern[str]:
    """A glob piece as a regex whose `*` and `?` never cover a LITERAL_ONLY character."""
    out, i = [], 0
    while i < len(piece):
        c = piece[i]
        if c == "*":
            out.append(_PLAIN + "*")
        elif c == "?":
            out.append(_PLAIN)
        elif c == "[" and (end := piece.find("]", i + 2 if piece[i + 1:i + 2] in ("!", "]") else i + 1)) > 0:
            body = piece[i + 1:end]
            negated = body.startswith("!")
            body = body[1:] if negated else body
            # A negated class must not let a special character in either.
            body = body.replace("\\", "\\\\").replace("[", "\\[")
            if not negated and body.startswith("^"):
                body = "\\" + body  # a glob's `[^…]` is a literal caret, not a negation
            out.append("[" + ("^#" + re.escape(LITERAL_ONLY) if negated else "") + body + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_matches(pattern: str, value: str) -> bool:
    """Whether `value` matches the glob `pattern` piece by piece, as an allow rule matches (see above)."""
    want, have = structure(pattern), structure(value)
    if len(want) != len(have):
        return False
    for i, (p, v) in enumerate(zip(want, have, strict=True)):
        if i % 2:  # an operator: only itself
            if p != v:
                return False
        elif not _strict(p).fullmatch(v):
            return False
    return True


def commands(value: str) -> list[str]:
    """The commands of a shell text: the pieces between operators, without what may precede a command."""
    return [_PREFIX.sub("", piece).strip() for piece in structure(value)[::2]]


def covers(pattern: str, value: str) -> bool:
    """Whether a deny or ask rule's glob covers `value`: the whole text, any one of its pieces, any
    simple command as it runs (at any level of wrapping), or a command we cannot see into."""
    if fnmatchcase(value, pattern) or any(fnmatchcase(command, pattern) for command in commands(value)):
        return True
    return any(command.opaque or any(fnmatchcase(form, pattern) for form in command.forms)
               for command in shell_words.commands(value))


def may_cover(value: str) -> bool:
    """Whether `value` could run something its text does not show (expansions, quoting, eval, …)."""
    return bool(_OBSCURING.search(value))


def escape_glob(text: str) -> str:
    """A glob that matches exactly `text`: `*`, `?` and `[` become one-character classes."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def argument_text(value: Any) -> str:
    """How a rule sees an argument: strings as they are, anything else as compact, sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def args_match(match: dict[str, str], args: dict[str, Any]) -> bool:
    """Whether an allow rule's `match` allows `args`: an empty `match` allows any arguments; else every
    argument is one it names, and each named one matches its glob narrowly (case-sensitive), an empty
    glob allowing any value or none. An argument it does not name is not allowed: a rule confirmed for
    `{"path": "notes.md"}` never stands for `{"path": "notes.md", "recursive": true}`."""
    if match and any(key not in match for key in args):
        return False
    for key, pattern in match.items():
        if pattern == "":  # any value, or none
            continue
        if key not in args or not isinstance(pattern, str) or not glob_matches(pattern, argument_text(args[key])):
            return False
    return True


def describe_match(match: dict[str, str] | None, joiner: str = "~", *, allow: bool = True) -> str:
    """A rule's `match` as people read it: "command ~ git status*, timeout: any value or none". Only an
    allow rule reads an empty glob as "any value or none" (`args_match`); a deny or ask rule's covers
    an empty value only (`args_covered`), and is shown as that."""
    if not match:
        return "any arguments"
    return ", ".join(f"{key} {joiner} {pattern}" if pattern
                     else f"{key}: any value or none" if allow else f'{key} {joiner} ""'
                     for key, pattern in match.items())


def args_covered(match: dict[str, str], args: dict[str, Any]) -> bool | None:
    """Whether a deny or ask rule's `match` covers `args`: True, False, or None when it cannot be told
    (a value hides what it runs, and the rule would cover it if it did not: fail closed, ask a person)."""
    unsure = False
    for key, pattern in match.items():
        if key not in args or not isinstance(pattern, str):
            return False
        text = argument_text(args[key])
        if not covers(pattern, text):
            if not may_cover(text):
                return False
            unsure = True
    return None if unsure else True


def exact_match(args: dict[str, Any]) -> dict[str, str]:
    """The `match` of a rule that allows exactly these arguments and no others (for an empty `args`, an
    empty `match`: that allows any arguments)."""
    return {key: escape_glob(argument_text(value)) for key, value in args.items()}
