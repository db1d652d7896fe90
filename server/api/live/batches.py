"""How a burst of live frames is written to one socket (live/stream.py): fewer, larger messages, without
the presence frames a later one replaces."""
from __future__ import annotations

PRESENCE_PREFIX = '{"type":"presence",'  # how presence frames are serialized (frame_text keeps key order)
# Characters written at once that take a turn of the event loop of their own: a finished 1 MB reply is a
# 4 MB frame, which every page of its world wrote in the same turn (encoded and copied: 15 ms each).
LARGE_WRITE = 256 * 1024


def superseded_dropped(texts: list[str]) -> list[str]:
    """A burst of live frames without the presence frames a later one in it replaces: each says who is
    here now, so a socket that fell behind a crowd's joins gets the last list, not every one of them."""
    last = max((i for i, text in enumerate(texts) if text.startswith(PRESENCE_PREFIX)), default=-1)
    if last <= 0:
        return texts
    return [text for i, text in enumerate(texts) if i >= last or not text.startswith(PRESENCE_PREFIX)]


def joined(texts: list[str], most: int = LARGE_WRITE) -> list[str]:
    """`texts` as fewer messages: runs of them joined up to `most` characters each, a longer one alone (a
    join of megabytes is a copy that held the loop 9 ms; its message is written in fragments anyway)."""
    out: list[str] = []
    run: list[str] = []
    size = 0
    for text in texts:
        if run and size + len(text) > most:
            out.append("".join(run))
            run, size = [], 0
        run.append(text)
        size += len(text)
    if run:
        out.append("".join(run))
    return out
