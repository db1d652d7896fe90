"""How events are stored: compact JSON, with orjson (several times faster than `json` on large reads)."""
from __future__ import annotations

import json
from functools import partial
from typing import Any, NamedTuple

import orjson

from .. import offload, vocab
from ..errors import AppError

# The stored JSON of one event, at most: the last line of defence, below every backend's own bound (Redis
# strings 512 MB), above what the bounded inputs make (a message of MAX_CONTENT characters, a tool's
# output cap, an MCP result of `mcp_result_limit` at most 16 MiB, binary content base64-encoded).
MAX_EVENT_BYTES = 32 * 1024 * 1024


def encode_bytes(event: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON (SQLite keeps it as a BLOB: read back as bytes, it decodes faster than text)."""
    try:
        return orjson.dumps(event)
    except TypeError:  # e.g. an integer beyond 64 bits: the standard library takes any JSON value
        return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


def encode_stored(event: dict[str, Any]) -> bytes:
    """An event as the log stores it; one over MAX_EVENT_BYTES is refused (`invalid`) before anything is written."""
    body = encode_bytes(event)
    if len(body) > MAX_EVENT_BYTES:
        raise AppError(vocab.INVALID, f"a {event.get('kind', 'event')} event of {len(body)} bytes is larger than "
                                      f"the log takes ({MAX_EVENT_BYTES} bytes, 32 MiB): nothing was stored")
    return body


async def encode_stored_off_loop(event: dict[str, Any]) -> bytes:
    """`encode_stored`, in a worker process for a large event: encoding a 16 MiB tool result held the loop
    for 10-25 ms while every world's requests waited."""
    heavy = offload.is_large(event, offload.HEAVY_JSON)
    return await offload.run(partial(encode_stored, event)) if heavy else encode_stored(event)


def encode(event: dict[str, Any]) -> str:
    return encode_bytes(event).decode()


def decode(body: str | bytes) -> dict[str, Any]:
    value: dict[str, Any] = orjson.loads(body)
    return value


class Large(NamedTuple):
    """A stored event too large to decode where it was read: `finish` decodes it in a worker process. (A
    reader thread serves every world: decoding a 16 MiB result there held every world's reads for
    100-200 ms, and held the GIL that the event loop needs.)"""
    seq: int
    body: str | bytes | tuple[bytes, ...]  # a tuple: the pieces of a body stored in pieces (sqlite_pieces.py)


def decoded(seq: int, body: str | bytes) -> dict[str, Any] | Large:
    """A read row as its event with its seq, or as `Large` (over offload.HEAVY_JSON bytes) for `finish`."""
    if len(body) > offload.HEAVY_JSON:
        return Large(seq, body)
    event = decode(body)
    event["seq"] = seq
    return event


async def finish(items: list[dict[str, Any] | Large]) -> list[dict[str, Any]]:
    """The events of a read, its `Large` ones decoded in a worker process (all in one trip), off the loop."""
    large = [item.body for item in items if isinstance(item, Large)]
    events = iter(await offload.run(partial(_decode_all, large)) if large else ())
    out = []
    for item in items:
        if isinstance(item, Large):
            event = next(events)
            event["seq"] = item.seq
            out.append(event)
        else:
            out.append(item)
    return out


async def finish_opened(found: dict[int, dict[str, Any] | Large],
                        opened: list[tuple[str, int]]) -> dict[str, dict[str, Any]]:
    """Each open key's event, from the events `found` by seq (one event may open several keys: decoded once)."""
    by_seq = {event["seq"]: event for event in await finish(list(found.values()))}
    return {key: by_seq[seq] for key, seq in opened}


def _decode_all(bodies: list[str | bytes | tuple[bytes, ...]]) -> list[dict[str, Any]]:
    return [decode(b"".join(body) if isinstance(body, tuple) else body) for body in bodies]
