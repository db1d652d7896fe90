"""The fan-out's shared frame bytes (server/api/live/fast_frames.py) and the presence coalescing of stream.py."""
from __future__ import annotations

import pytest
from websockets.frames import Frame, Opcode

from server.api.live.fast_frames import encode_text_frame, frame_bytes
from server.api.live.stream import superseded_dropped


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65_535, 65_536, 200_000])
def test_a_text_frame_is_the_bytes_websockets_would_send(size: int) -> None:
    text = ("é" * size)[:size] if size % 2 else "x" * size  # multi-byte characters too
    expected = Frame(Opcode.TEXT, text.encode()).serialize(mask=False, extensions=[])
    assert encode_text_frame(text) == expected


def test_frame_bytes_are_shared_for_the_same_string_and_right_for_an_equal_one() -> None:
    text = "".join(["{", '"type":"chunk"', "}"])  # built at run time: its own object
    assert frame_bytes(text) is frame_bytes(text)
    other = "".join(["{", '"type":"chunk"', "}"])
    assert frame_bytes(other) == encode_text_frame(text)
    big = "y" * 100_000
    assert frame_bytes(big) == encode_text_frame(big)


def test_only_the_last_presence_frame_of_a_burst_is_kept_and_the_rest_keep_their_order() -> None:
    p1, p2, p3 = (f'{{"type":"presence","members":[{n}]}}' for n in range(3))
    e1, c1, c2 = '{"type":"event","event":{"seq":1}}', '{"type":"chunk","delta":"a"}', '{"type":"chunk","delta":"b"}'
    assert superseded_dropped([p1, e1, p2, c1, p3, c2]) == [e1, c1, p3, c2]
    assert superseded_dropped([e1, p1, c1]) == [e1, p1, c1]
    assert superseded_dropped([p1]) == [p1]
    assert superseded_dropped([e1, c1]) == [e1, c1]
