"""Characters that make text look different from what it is (issue #28, item 3).

A decider approves what they read: bidirectional controls reorder it on screen (`echo ok; X= # rm -rf
victim` with the `rm` seemingly commented out), zero-width and other format characters vanish, control
characters move the cursor, and look-alikes (a Cyrillic o, a fullwidth rm, a non-breaking space) read
as the ASCII they are not. Every client shows such characters escaped (`\\u202e`) and warns, as GitHub's
"hidden Unicode" warning does. Pure functions, no dependencies: the page, AG-UI and the terminal
client use the same ones.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

WARNING = ("This call contains hidden or look-alike Unicode characters: what runs may differ from what it "
           "seems to say. They are shown escaped")

# Letters of other scripts drawn like ASCII ones (the common part of Unicode's confusables), escaped
# here too: this file must not hold what it warns of.
_LOOK_ALIKES = frozenset(
    # Cyrillic (and the Latin script g)
    "\u0410\u0412\u0415\u0405\u0406\u0408\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0425\u0423\u0430"
    "\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455\u04bb\u0501\u051b\u051d\u04cf\u0261"
    # Greek
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7\u03bf\u03b9"
    "\u03bd\u03b1\u03c1\u03c5\u03ba"
    # Armenian
    "\u0555\u0585\u057d\u0570\u0578\u054f"
    # the Latin dotless i; hyphens and minus signs that read as `-` (`\u2010\u2010dry-run` is no option)
    "\u0131\u2010\u2011\u2012\u2043\u2212\ufe63"
)
# En and em dashes are prose, except where they stand for an option's `-` or `--` (`\u2013dry-run`).
_DASH_OPTION = re.compile("(?<!\\S)[\u2013\u2014]+(?=[A-Za-z])")
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
# Invisible though not of category Cf: fillers, the blank braille cell, variation selectors, the CGJ.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5") | frozenset(
    chr(c) for c in (*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0), *range(0x180B, 0x1810)))
_BIDI = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C))


def kind_of(ch: str, among_ascii: bool = True) -> str | None:
    """Why `ch` is not shown as itself ("bidi control", "invisible", "control", "look-alike"), or None.

    `among_ascii`: the text around it is ASCII, so a letter that merely resembles an ASCII one is a
    disguise rather than a word of another language."""
    if ch in "\n\t" or " " <= ch <= "~":
        return None
    if ch in _BIDI:
        return "bidi control"
    category = unicodedata.category(ch)
    if category == "Cc":
        return "control"
    if category in ("Cf", "Co", "Cn", "Cs") or ch in _INVISIBLE:
        return "invisible"
    if category in ("Zs", "Zl", "Zp"):  # any space but the ASCII one, and line separators
        return "look-alike"
    folded = unicodedata.normalize("NFKC", ch)
    if len(folded) == 1 and " " < folded <= "~":  # fullwidth, mathematical and other compatibility forms
        return "look-alike"
    if (ch in _LOOK_ALIKES or ch in "\u2013\u2014") and among_ascii:
        return "look-alike"
    return None


def _disguised(text: str) -> set[int]:
    """Where look-alikes of `text` pass for ASCII: all of them when the rest of it is ASCII, else those in
    a word (a run of non-blanks) made of ASCII and look-alikes alone: `victim` spelt with a Cyrillic i and
    c, or a domain all in Cyrillic look-alikes, among other words; a Russian word, which has letters of
    its own, is left alone."""
    if all(ch.isascii() or ch in _LOOK_ALIKES for ch in text):
        return set(range(len(text)))
    return {m.start() + i for m in re.finditer(r"\S+", text)
            if all(ch.isascii() or ch in _LOOK_ALIKES for ch in m.group())
            for i in range(len(m.group()))}


def describe(ch: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`: how a warning names a character."""
    fallback = "CONTROL CHARACTER" if unicodedata.category(ch) == "Cc" else "UNNAMED CHARACTER"
    return f"U+{ord(ch):04X} {unicodedata.name(ch, fallback)}"


def escaped(ch: str) -> str:
    """A character as the escape that stands for it on screen: `\\u202e` (`\\U000e0041` past U+FFFF)."""
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def hidden_pieces(text: str) -> list[tuple[str, str | None]]:
    """`text` cut into runs shown as they are (kind None) and single flagged characters, each given as
    its escape with its kind: what a page renders, marking the escapes apart from typed backslashes."""
    if text.isascii() and not _CONTROLS.search(text):
        return [(text, None)] if text else []  # the common case, at C speed: nothing to flag
    disguised = _disguised(text) if any(ch in _LOOK_ALIKES for ch in text) else set()
    disguised |= {m.start() + i for m in _DASH_OPTION.finditer(text) for i in range(len(m.group()))}
    out: list[tuple[str, str | None]] = []
    plain: list[str] = []
    for i, ch in enumerate(text):
        kind = kind_of(ch, i in disguised)
        if ch in "\ufe0e\ufe0f" and i and unicodedata.category(text[i - 1]) == "So":
            kind = None  # text or emoji style of the symbol before it (❤️): it hides nothing
        if kind is None:
            plain.append(ch)
            continue
        if plain:
            out.append(("".join(plain), None))
            plain = []
        out.append((escaped(ch), kind))
    if plain:
        out.append(("".join(plain), None))
    return out


def escape_hidden(text: str) -> str:
    """`text` with every flagged character replaced by its escape (for a terminal or a log line)."""
    return "".join(piece for piece, _ in hidden_pieces(text))


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def hidden_characters(value: Any) -> list[str]:
    """The distinct flagged characters of a JSON value (a call's arguments), described, in order of
    first appearance: empty when it shows as it is."""
    seen: dict[str, None] = {}
    for text in _strings(value):
        for piece, kind in hidden_pieces(text):
            if kind is not None:
                seen.setdefault(describe(piece_char(piece)), None)
    return list(seen)


def piece_char(escape: str) -> str:
    """The character an escape made by `escaped` stands for."""
    return chr(int(escape[2:], 16))


def hidden_warning(found: list[str]) -> str | None:
    """The warning for a call whose arguments hold the flagged characters `found` (`hidden_characters`),
    naming them; None when there are none."""
    return f"{WARNING}: {', '.join(found)}." if found else None
