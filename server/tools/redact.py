"""Hiding secret-looking values, and matching tool arguments against approval-rule globs."""
from __future__ import annotations

import copy
import json
from fnmatch import fnmatchcase
from typing import Any

REDACTED = "[redacted]"
# Substrings of a key that mark its value as secret. Deliberately broad ("author" matches "auth"):
# showing a redaction by mistake costs little, leaking a token costs a lot.
SECRET_MARKERS = ("key", "token", "secret", "password", "passwd", "auth", "credential", "api_key")


def is_secret_key(key: object) -> bool:
    lowered = str(key).lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def redact(value: Any) -> Any:
    """A deep copy of `value` in which every secret-looking dict key, at any depth, maps to "[redacted]"."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_key(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item) for item in value)
    return copy.deepcopy(value)


def args_match(match: dict[str, str], args: dict[str, Any]) -> bool:
    """True if every `match` key is in `args` and its value matches the glob (fnmatch, case-sensitive).

    Non-string values are compared as compact JSON. An empty `match` matches any arguments.
    A wildcard never stands for a shell control sequence (`;`, `&`, `|`, a backtick, `$(`, a
    newline): `git status*` must not approve `git status; rm -rf ~`. A value containing one
    matches only a pattern that spells it out literally.
    """
    for key, pattern in match.items():
        if key not in args or not isinstance(pattern, str):
            return False
        value = args[key]
        text = value if isinstance(value, str) else json.dumps(
            value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        if not fnmatchcase(text, pattern):
            return False
        if any(seq in text and seq not in pattern for seq in _SHELL_CONTROL):
            return False
    return True


_SHELL_CONTROL = (";", "&", "|", "`", "$(", "\n", "\r", ">", "<")
