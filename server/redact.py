"""Hiding secret-looking values wherever events leave the server.

Redaction is by *value*, not by key name: a key called `key`, `author` or `max_tokens` says
nothing about its value, and hiding it made deciders approve blind. What is hidden:
- well-known credential shapes: OpenAI/Anthropic keys, GitHub, Slack, AWS and Google keys, JWTs,
  `Bearer …` tokens, PEM private keys, the password in a URL (`https://user:…@host`), `Authorization:
  Basic …`, `curl -u user:…`, `PGPASSWORD=…` (and other `*_TOKEN=`, `*_KEY=`… variables), `mysql -p…`
  and `sshpass -p …`;
- long high-entropy strings (random tokens of 32 characters or more);
- the exact values of secrets this server knows (its owner token, API keys, an MCP server's env and
  header values and the arguments its settings mask);
- the value of an argument whose key says it is one (`password`, `api_key`, `GITHUB_TOKEN`, …).

Each hidden value becomes `[redacted]` in place, so the rest stays exactly as it was; the log
keeps the real values (tools run with them, the LLM sees what it wrote).
"""
from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable
from functools import partial
from itertools import pairwise
from typing import Any, TypeVar

import orjson

from . import offload

T = TypeVar("T")

logger = logging.getLogger(__name__)

REDACTED = "[redacted]"

# Keys whose value is a secret whatever it looks like: the key, lower-cased without `_`, `-` or `.`,
# ends with one of these (`api_key`, `GITHUB_TOKEN`, `db-password`; not `key`, `author`, `max_tokens`).
SECRET_KEY_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey", "privatekey",
                      "credential", "credentials", "authorization", "cookie", "bearer")

_SHAPES = [
    r"-----BEGIN[A-Z ]*PRIVATE KEY-----.*?-----END[A-Z ]*PRIVATE KEY-----",
    r"-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*",  # a key cut short still must not show
    r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}",
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"\bAIza[0-9A-Za-z_-]{30,}",
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
]
_SHAPE = re.compile("|".join(f"(?:{s})" for s in _SHAPES), re.DOTALL)
# The fixed part of every shape above. `_SHAPE` tries each alternative at each position (~25 us for a
# paragraph); this finds the fixed parts alone in ~2 us, so text without any skips `_SHAPE` (a match
# of `_SHAPE` always contains one). A new shape needs its fixed part here: test_redact_hints checks.
_SHAPE_HINT = re.compile(r"-----BEGIN|sk-|gh[pousr]_|github_pat_|xox|AKIA|ASIA|AIza|eyJ")
# `Bearer <token>` and `token=<token>`-style pairs: the label stays, the value goes. On one line: a label
# ending a line took the next line's first word (`token:` then `password = …` hid `password`, showed the rest).
_LABELLED = re.compile(r"(?i)\b(?:(bearer)([ \t]+)|(token|api[_-]?key|secret|password|passwd)([ \t]*[:=][ \t]*))"
                       r"([A-Za-z0-9._~+/=-]{6,})")
# Credentials that commands and headers carry by position, not by a label the pattern above knows: group 1
# (what comes before it) stays, group 2 goes. `Authorization: Basic <base64>`; `curl -u user:<password>`
# (`--user` too); `PGPASSWORD=<password>` and any upper-case variable ending in PASSWORD, PASSWD, PWD, PASS,
# SECRET, TOKEN or KEY; `mysql -p<password>` (mysqldump, mariadb…); `sshpass -p <password>`. A command's
# other flags may come between the program and its flag, but never a `;`, `|`, `&` or a new line.
_POSITIONAL = re.compile(
    r"(?i:(\bauthorization[\"']?[ \t]*[:=][ \t]*[\"']?basic[ \t]+))([A-Za-z0-9+/=._~-]{4,})"
    r"|(\bcurl\b[^\n;|&]*?[ \t](?:-u|--user)(?:[ \t]+|=)?[\"']?[^\s:\"']*:)([^\s\"'@]+)"
    r"|(\b[A-Z][A-Z0-9_]*(?:PASSWORD|PASSWD|PWD|PASS|SECRET|TOKEN|KEY)=[\"']?)([^\s\"']+)"
    r"|(\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mariadb|mariadb-dump)\b[^\n;|&]*?[ \t]-p)([^\s\"']+)"
    r"|(\bsshpass\b[^\n;|&]*?[ \t]-p[ \t]*[\"']?)([^\s\"']+)")
_POSITIONAL_HINT = re.compile(r"(?i)basic|curl|(?:PASSWORD|PASSWD|PWD|PASS|SECRET|TOKEN|KEY)=|mysql|mariadb|sshpass")
_POSITIONAL_WORDS = ("basic", "curl", "password=", "passwd=", "pwd=", "pass=", "secret=", "token=", "key=", "mysql",
                     "mariadb", "sshpass")  # the hint's words, for ASCII text
_LABELLED_WORDS = ("bearer", "token", "api", "secret", "passw")  # words every `_LABELLED` match holds
# The password of a URL (`postgres://app:<password>@db`, a proxy's `https://user:<password>@host`): the
# rest stays. Groups: what comes before it, the password, the `@`.
URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)([^\s/@]+)(@)")
# Ids the server or the model made for calls and records: shown as they are, never mistaken for tokens.
_IDS = frozenset({"id", "tool_call_id", "toolCallId", "call_id", "approval_id", "rule_id", "grant_id", "expiresAt",
                  "type"})
_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_.~-]{32,}")
# An invite token: a world id (vocab.WORLD_ID), a dot and 32 URL-safe characters, with lower-case letters and
# digits or capitals among them (a snake_case name of 32 letters is not one).
_INVITE_TOKEN = re.compile(r"(?<![A-Za-z0-9_.-])[a-z0-9][a-z0-9-]{0,63}\."
                           r"(?=[A-Za-z0-9_-]*[a-z])(?=[A-Za-z0-9_-]*[A-Z0-9])[A-Za-z0-9_-]{32}(?![A-Za-z0-9_-])")
_ENTROPY_BITS = 4.0  # bits per character: random 32-character tokens measure 4.1 to 4.9
_SWITCH_RATE = 0.4  # how often the character kind changes: random tokens 0.35 to 0.8, CamelCase words ~0.3
MIN_KNOWN = 8  # shorter "secrets" would redact ordinary words
# Longer "secrets" are not remembered: each costs every one of its starts (for streaming), so memory and time
# grow with the square of its length (30 kB took seconds and gigabytes). Tokens are far shorter (OAuth ones
# over this are refused, oauth.py); a value this long is a file, not a credential typed into a setting.
MAX_KNOWN = 4096

_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None
# Every start of a known secret short of the whole (streaming asks whether a text ends in one), and the
# longest known secret: the question costs one set lookup per position, however many secrets there are.
_known_starts: set[str] = set()
_known_firsts: set[str] = set()  # their first characters: most positions are passed over on one
_longest_known = 0
secrets_generation = 0  # grows with each secret remembered: what was redacted before may show it


def remember_secret(value: str | None) -> None:
    """Hide every occurrence of `value` from now on (the owner token, an API key, an MCP env value or masked arg)."""
    global _known_pattern, secrets_generation, _longest_known
    if value and len(value) > MAX_KNOWN:
        logger.warning("a secret of %d characters is too long to hide by its value (at most %d)", len(value),
                       MAX_KNOWN)
        return
    if value and len(value) >= MIN_KNOWN and value not in _known:
        _known.add(value)
        _known_starts.update(value[:n] for n in range(1, len(value)))
        _known_firsts.add(value[0])
        _longest_known = max(_longest_known, len(value))
        secrets_generation += 1
        _known_pattern = re.compile("|".join(re.escape(v) for v in sorted(_known, key=len, reverse=True)))


def hide_known(text: str) -> str:
    """`text` with every remembered secret hidden, and nothing guessed by shape (a log line's ids stay)."""
    return _known_pattern.sub(REDACTED, text) if _known_pattern is not None else text


def known_secrets() -> tuple[str, ...]:
    """The secrets `remember_secret` was told, for a worker process to redact as this one does."""
    return tuple(sorted(_known))


async def in_worker(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` in a worker process (server/offload.py) that first learns the secrets this one knows:
    redaction of a large input there hides what it would hide here."""
    return await offload.run(partial(_knowing, known_secrets(), work, *args))


def _knowing(known: tuple[str, ...], work: Callable[..., T], *args: Any) -> T:
    for secret in known:
        remember_secret(secret)
    return work(*args)


def unfinished_known_secret(text: str, end: int) -> int:
    """Where to cut `text` short of `end` so that no known secret is cut in two: the start of the
    earliest known secret that runs past `end`, or of the start of one that the text ends in; `end`
    when there is none. For streaming: what is shown up to there can never turn out to be the first
    part of a secret (any characters at all may make one up)."""
    while True:
        for start in range(max(0, end - _longest_known + 1), end):
            if text[start] in _known_firsts and _runs_past(text, start, end):
                end = start  # a cut further back may split another secret: look again
                break
        else:
            return end


def _runs_past(text: str, start: int, cut: int) -> bool:
    """Whether a known secret may begin at `start` and run past `cut`: one does, or the text ends in one."""
    last = min(len(text), start + _longest_known)
    for stop in range(cut + 1, last + 1):
        piece = text[start:stop]
        if piece in _known:
            return True
        if piece not in _known_starts:
            return False
    return text[start:last] in _known_starts


def _entropy(text: str) -> float:
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _kind(c: str) -> int:
    return 0 if c.isupper() else 1 if c.islower() else 2 if c.isdigit() else 3


def _looks_random(text: str) -> bool:
    """Random tokens mix upper, lower and digits, and switch between them at most characters;
    identifiers and paths are long runs of lower-case words (measured: see tests/test_redact.py)."""
    kinds = [_kind(c) for c in text]
    if not {0, 1, 2} <= set(kinds):
        return False
    switches = sum(a != b for a, b in pairwise(kinds)) / (len(kinds) - 1)
    return switches >= _SWITCH_RATE and _entropy(text) >= _ENTROPY_BITS


def _high_entropy(match: re.Match[str]) -> str:
    text = match.group(0)
    if _looks_random(text):
        return REDACTED
    # An invite token (`<world id>.<token_urlsafe(24)>`): a long, wordy world id made the whole read as words.
    return REDACTED if "." in text and _INVITE_TOKEN.search(text) else text


def redact_text(text: str, *, random_looking: bool = True) -> str:
    """`text` with every secret-looking value replaced by `[redacted]` (long random-looking strings too,
    unless `random_looking` is False: ids the server made look random)."""
    # Which labels the text may hold, in any case: over ASCII text (most of it) by plain search. A
    # case-insensitive regex tried every word at every position: 6 s of the 8 s that redacting a 16 MiB
    # tool result took. The replacements below cannot make a label appear, so one look serves them all.
    lowered = text.lower() if text.isascii() else None
    if _known_pattern is not None:
        text = _known_pattern.sub(REDACTED, text)
    if _SHAPE_HINT.search(text):
        text = _SHAPE.sub(REDACTED, text)
    if _may_hold(text, lowered, _LABELLED_WORDS, None):
        text = _LABELLED.sub(lambda m: (m.group(1) or m.group(3)) + (m.group(2) or m.group(4)) + REDACTED, text)
    if _may_hold(text, lowered, _POSITIONAL_WORDS, _POSITIONAL_HINT):
        text = _POSITIONAL.sub(_keep_label, text)
    if "://" in text:
        text = URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    return _CANDIDATE.sub(_high_entropy, text) if random_looking else text


def _may_hold(text: str, lowered: str | None, words: tuple[str, ...], hint: re.Pattern[str] | None) -> bool:
    """Whether `text` may hold one of `words` in any case: `lowered` (the ASCII text, lower-cased) is
    searched plainly; other text by `hint` (None: it may), which knows Unicode's case foldings too
    (the long s for s, the Kelvin sign for k)."""
    if lowered is not None:
        return any(word in lowered for word in words)
    return hint is None or hint.search(text) is not None


def _keep_label(match: re.Match[str]) -> str:
    """What `_POSITIONAL` matched, its label (the odd group that matched) kept and its value hidden."""
    for label in range(1, len(match.groups()), 2):
        if match.group(label) is not None:
            return match.group(label) + REDACTED
    return match.group(0)


def is_secret_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    folded = key.lower().replace("-", "").replace("_", "").replace(".", "")
    return folded.endswith(SECRET_KEY_ENDINGS)


def redact(value: Any) -> Any:
    """A copy of `value` with secret-looking values hidden at any depth (strings, dicts, lists).

    A string holding a JSON object or array (tool arguments, tool results) is redacted as JSON,
    so keys like `password` inside it count too, and the text stays valid JSON.
    """
    if isinstance(value, str):
        return _redact_string(value)
    if isinstance(value, dict):
        return {(redact_text(k) if isinstance(k, str) else k): _redact_item(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(item) for item in value)
    return value


def _redact_item(key: object, value: Any) -> Any:
    if is_secret_key(key) and isinstance(value, str) and value:
        return REDACTED
    if key in _IDS and isinstance(value, str):  # an id: known shapes and secrets only, never by entropy
        return redact_text(value, random_looking=False)
    return redact(value)


def _redact_string(text: str) -> str:
    if text[:1] in ("{", "[") and len(text) > 2:
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            return redact_text(text)
        hidden = redact(parsed)
        return text if hidden == parsed else orjson.dumps(hidden).decode()
    return redact_text(text)


def contains_redaction(value: Any) -> bool:
    """Whether `value` (as clients receive it) has a hidden value somewhere: shown marked as such."""
    if isinstance(value, str):
        return REDACTED in value
    if isinstance(value, dict):
        # keys too: `redact` hides a secret-looking key as well (an edit resending it would run with it)
        return any(contains_redaction(k) or contains_redaction(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(contains_redaction(v) for v in value)
    return False
