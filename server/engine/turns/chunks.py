"""Streaming LLM text to every screen: the first delta at once, then at most one frame per interval.

A model can emit 50-100 tiny deltas a second; sending each as its own frame to every
connection costs one send per delta per viewer. Joining the deltas of one short interval
keeps the stream live to the eye while dividing the frames (bench/fanout.py measures it).

Streamed text leaves the server redacted like every stored event (see `public`): a secret may
arrive in several deltas, so text is only sent up to the end of its last character that no secret is
made of (no secret shape spans one), never into an unfinished private key block, and what is sent is
cut from the redaction of a window that reaches back before it.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

from ... import offload
from ...redact import in_worker, redact_text, unfinished_known_secret

CHUNK_INTERVAL = 0.04  # seconds: about 25 frames a second at most, per streaming message
_LOOKBACK = 256  # characters before the unsent text that are redacted with it
_SLICE = 16 * 1024  # characters redacted and sent at a time (about 3 ms of the loop)
# A model that streams faster than the loop redacts leaves more than this behind: the rest is redacted in a
# worker process (server/offload.py), a large slice at a time. Sliced on the loop, a 1 MB reply kept the
# loop busy for 1.4 s straight (bench/isolation.py under py-spy), and every world's requests waited.
_BACKLOG = offload.HEAVY
_WORKER_SLICE = 256 * 1024
_PEM_END = re.compile(r"-----END[A-Z ]*PRIVATE KEY-----")
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9+/=_.~:-]+\Z")  # what secrets are made of, at the end of the text
# A URL whose authority has not ended: `user:password@` may be coming, and a password may hold any
# printable ASCII character. It ends at `/`, `@`, white space or any other character (CJK text after a
# bare URL flows), and after 256 characters (no password is that long).
_OPEN_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[!-.0-?A-~]{0,256}\Z")


class ChunkStream:
    def __init__(self, publish: Callable[[str], Awaitable[None]], interval: float = CHUNK_INTERVAL) -> None:
        self._publish = publish
        self._interval = interval
        self._pending: list[str] = []
        self._text = ""  # the deltas from a little before what was sent on (the rest is not needed again)
        self._done = 0  # how much of `_text` was redacted and sent
        self._last_sent = float("-inf")
        self._timer: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()  # one flush at a time: a slice may wait for a worker
        self._discards = 0  # a slice redacted meanwhile by a worker is dropped with the rest

    async def add(self, delta: str) -> None:
        self._pending.append(delta)
        if self._timer is not None:
            return  # a flush is already scheduled
        wait = self._last_sent + self._interval - asyncio.get_running_loop().time()
        if wait <= 0:
            await self.flush()
        else:
            self._timer = asyncio.create_task(self._flush_later(wait))

    async def _flush_later(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self._timer = None
        await self.flush()

    async def flush(self, final: bool = False) -> None:
        """Send what is safe to show (all of it when `final`), a slice at a time: a model that streams
        faster than the loop flushes left hundreds of KB to one redaction, which held the loop (and every
        world) for 100 ms."""
        async with self._flushing:
            if self._pending:
                self._text += "".join(self._pending)
                self._pending = []
            while await self._flush_slice(final):
                await asyncio.sleep(0)  # the rest after whatever else waits

    async def _flush_slice(self, final: bool) -> bool:
        """Send the next slice (of at most _SLICE characters, or _WORKER_SLICE found and redacted in a worker
        when the stream is far ahead) that is safe to show; whether one was sent."""
        discards = self._discards
        if len(self._text) - self._done > _BACKLOG:
            # (finding the slice's end scans it too: 335 ms of the loop for 256 KiB on a loaded machine)
            found = await in_worker(_next_slice, self._text, self._done, final, _WORKER_SLICE)
            if discards != self._discards:
                return False
        else:
            found = _next_slice(self._text, self._done, final, _SLICE)
        if found is None:
            return False
        end, shown = found
        self._done = end
        self._last_sent = asyncio.get_running_loop().time()
        # Only the lookback before what was sent is read again: keeping the whole text made each flush copy
        # and search all of it (a long reply's streaming grew with its square).
        cut = max(0, end - _LOOKBACK)
        self._text, self._done = self._text[cut:], end - cut
        # A worker's slice goes out in pieces of a loop's slice: each page scans a delta on the loop as it
        # takes it (web/streaming.py), and 256 KiB at once held it 30-50 ms for every world.
        # The attempt may be dropped meanwhile (a retry, a stop): its pieces left are dropped with it.
        for at in range(0, len(shown), _SLICE):
            if discards != self._discards:
                return False
            await self._publish(shown[at:at + _SLICE])
        return True

    async def close(self) -> None:
        """Send what is left (before the whole message is stored)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush(final=True)

    def discard(self) -> None:
        """Drop what is left (the attempt failed and will be retried)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
        self._text, self._done = "", 0
        self._discards += 1


def _next_slice(text: str, done: int, final: bool, size: int) -> tuple[int, str] | None:
    """Where the next slice of `text` after `done` (at most `size` characters) that is safe to show ends,
    and its redacted text; None when nothing new is safe to show."""
    limit = min(len(text), done + size)
    if limit == len(text):
        end = limit if final else _safe_end(text, done)
    else:  # the slice ends where the text goes on: treated as an end, a token there waits for the next
        end = _safe_end(text[:limit], done)
        if end <= done:  # one token longer than a slice: taken whole
            end = len(text) if final else _safe_end(text, done)
    if end <= done:
        return None
    # Redact a window that starts a little before what was sent (a label such as `password = `
    # may precede its value), not the whole text each time: streaming stays linear.
    start = max(0, done - _LOOKBACK)
    start = max(start, text.rfind("\n", start, done) + 1)
    before, window = redact_text(text[start:done]), redact_text(text[start:end])
    if not window.startswith(before):
        return None  # what was sent would read differently now: wait (white space never does this)
    return end, window[len(before):]


def _safe_end(text: str, sent: int) -> int:
    """How much of `text` can be redacted and shown now: up to the end of its last character that no
    secret is made of (white space, punctuation, any non-ASCII letter: CJK text flows), so an unfinished
    token waits for its end; never into a URL's authority that may still bring a password, nor into
    what may be the start of a secret the server knows (those may hold any character); and never into
    a private key block that has not ended yet.

    `sent`: how much was shown before. Its unfinished token cannot begin earlier (what was shown ends
    before such a character, or one follows it), so the search starts there: searching the whole text
    at every flush made a long reply's streaming quadratic (13% of a fan-out server's time).
    """
    tail = _TOKEN_TAIL.search(text, sent)
    end = tail.start() if tail else len(text)
    url = _OPEN_AUTHORITY.search(text, sent)
    if url:
        end = min(end, url.start())
    end = unfinished_known_secret(text, end)
    begin = text.rfind("-----BEGIN")
    if begin >= 0:
        finished = _PEM_END.search(text, begin)
        if finished is None or end < finished.end():  # the block (or the white space after it) is not all here
            glued = _TOKEN_TAIL.search(text, sent, begin)  # a token the block's start is glued to waits too:
            end = min(end, glued.start() if glued else begin)  # cut short, it may no longer look secret
    return end
