"""A large bus frame (the event of a 16 MiB tool result) parsed once per process, in a worker.

The engine's listener and every page and JSON socket of a world get the very same string from the bus.
Each parsed it for itself: three trips of 16 MiB to a worker and back, each pickled and unpickled by the
server's threads while the event loop waited for the GIL, and the loop hashed the string to look it up
(a few milliseconds for 16 MiB). Here the first asker sends it to a worker and those asking meanwhile wait
for that run; the parse is kept for the last few frames, found by the string's identity, not its hash.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from functools import partial
from typing import Any

from .. import offload
from ..aio import SingleFlight
from ..log.codec import decode

_KEPT = 4  # frames kept, text and parse (a few: these are the largest frames there are)
_kept: OrderedDict[int, tuple[str, dict[str, Any]]] = OrderedDict()
_flights: SingleFlight[dict[str, Any]] = SingleFlight()


async def parsed(text: str) -> dict[str, Any]:
    """`decode(text)`; each asker gets its own dicts and lists (the strings in them are shared: immutable)."""
    return copy.deepcopy(await _shared(text))


async def event_info(text: str) -> tuple[int, str | None]:
    """(seq, kind) of an event frame."""
    event = (await _shared(text))["event"]
    return int(event["seq"]), event.get("kind")


async def _shared(text: str) -> dict[str, Any]:
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
