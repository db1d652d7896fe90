"""How a page's batch of frames becomes messages (server/api/live/batches.py `joined`): few messages, and no
join of megabytes on the event loop (it held every world 9 ms)."""
from __future__ import annotations

from server.api.live.batches import joined


def test_small_frames_are_joined_into_few_messages_in_order() -> None:
    frames = [f"<div>{n % 10}</div>" for n in range(500)]  # 12 characters each: 83 to a message of 1,000
    assert joined(frames, most=1000) == ["".join(frames[i:i + 83]) for i in range(0, 500, 83)]


def test_a_frame_longer_than_a_message_goes_alone_between_the_runs_around_it() -> None:
    assert joined(["a", "b", "x" * 50, "c", "d"], most=10) == ["ab", "x" * 50, "cd"]
    assert joined(["x" * 50], most=10) == ["x" * 50]
    assert joined([], most=10) == []
