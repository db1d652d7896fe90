"""A large bus frame (the event of a 16 MiB tool result) parsed once per process for its sockets, in a worker.

Every page and JSON socket of a world gets the very same string from the bus. The pages parsed it (shared
through the fragment cache, which hashed the string on the loop: a few milliseconds for 16 MiB), and the
streams sent it to a worker once more for its seq and kind: two trips of 16 MiB, each pickled and unpickled
by the server's threads while the event loop waited for the GIL. Here the first asker sends it to a worker
and those asking meanwhile wait for that run; the parse is kept for the last few frames, found by the
string's identity, not its hash. What askers get is shared: they read it, never change it. (The engine's
listener parses a frame for itself: it keeps parts of events, and may change them.)
"""
from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

from ... import offload
from ...aio import SingleFlight
from ...log.codec import decode

_KEPT = 4  # frames kept, text and parse (a few: these are the largest frames there are)
_kept: OrderedDict[int, tuple[str, dict[str, Any]]] = OrderedDict()
_flights: SingleFlight[dict[str, Any]] = SingleFlight()


async def shared(text: str) -> dict[str, Any]:
    """`decode(text)`, made once in a worker for all the askers of this process: to read, not to change."""
    key = id(text)
    kept = _kept.get(key)
    if kept is not None and kept[0] is text:  # the id of a freed string may be taken again: the same one?
        _kept.move_to_end(key)
        return kept[1]
    # The flight's closure holds `text`, so no other string takes its id while it runs.
    frame = await _flights.run(key, lambda: offload.run(partial(decode, text)))
    _kept[key] = (text, frame)
    if len(_kept) > _KEPT:
        _kept.popitem(last=False)
    return frame


async def event_info(text: str) -> tuple[int, str | None]:
    """(seq, kind) of an event frame."""
    event = (await shared(text))["event"]
    return int(event["seq"]), event.get("kind")
