"""The bound on one stored event is the last line of defence: every input bounded elsewhere fits below it."""
from __future__ import annotations

import pytest

from server import offload, vocab
from server.engine.engine import MAX_CONTENT
from server.engine.world.worlds import MAX_RESULT_LIMIT
from server.errors import AppError
from server.log.codec import MAX_EVENT_BYTES, encode_stored, encode_stored_off_loop
from server.tools.builtin import READ_MAX_LIMIT, SHELL_OUTPUT_LIMIT

_SLACK = 1024 * 1024  # the rest of an event: ids, names, arguments, structured content


def test_bounded_inputs_fit_in_one_stored_event() -> None:
    assert MAX_CONTENT * 6 + _SLACK < MAX_EVENT_BYTES  # a message, each character escaped as \u00XX at worst
    assert MAX_RESULT_LIMIT * 4 // 3 + _SLACK < MAX_EVENT_BYTES  # an MCP result, its binary in base64
    assert max(READ_MAX_LIMIT, SHELL_OUTPUT_LIMIT) * 2 + _SLACK < MAX_EVENT_BYTES


def test_an_event_over_the_bound_is_invalid_and_one_at_it_is_stored() -> None:
    event = {"kind": "notice", "text": ""}
    room = MAX_EVENT_BYTES - len(encode_stored(event))
    assert len(encode_stored({**event, "text": "x" * room})) == MAX_EVENT_BYTES
    with pytest.raises(AppError) as refused:
        encode_stored({**event, "text": "x" * (room + 1)})
    assert refused.value.code == vocab.INVALID and "notice event" in refused.value.message


async def test_a_large_event_over_the_bound_is_refused_as_clearly_when_encoded_in_a_worker(
        caplog: pytest.LogCaptureFixture) -> None:
    """A large event is encoded in a worker process (off the loop): its refusal crosses back whole, and
    the pool stays up (a refusal that could not be unpickled broke it)."""
    event = {"kind": "message", "role": "tool", "content": "x" * MAX_EVENT_BYTES}
    try:
        with pytest.raises(AppError) as refused:
            await encode_stored_off_loop(event)
    finally:
        offload.shutdown()
    assert refused.value.code == vocab.INVALID and "message event" in refused.value.message
    assert refused.value.status == 400
    assert "worker pool broke" not in caplog.text
