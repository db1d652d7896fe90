"""The presence coalescing of server/api/live/batches.py: a burst keeps only its last presence frame."""
from __future__ import annotations

from server.api.live.batches import superseded_dropped


def test_only_the_last_presence_frame_of_a_burst_is_kept_and_the_rest_keep_their_order() -> None:
    p1, p2, p3 = (f'{{"type":"presence","members":[{n}]}}' for n in range(3))
    e1, c1, c2 = '{"type":"event","event":{"seq":1}}', '{"type":"chunk","delta":"a"}', '{"type":"chunk","delta":"b"}'
    assert superseded_dropped([p1, e1, p2, c1, p3, c2]) == [e1, c1, p3, c2]
    assert superseded_dropped([e1, p1, c1]) == [e1, p1, c1]
    assert superseded_dropped([p1]) == [p1]
    assert superseded_dropped([e1, c1]) == [e1, c1]
