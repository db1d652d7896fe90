"""The stdio MCP reader's line splitter (issue #30): linear, and never holding more than its limit of a line;
an over-long line is dropped as it streams in, its request id read from either end."""
from __future__ import annotations

import json

from server.tools.mcp.stdio import LARGE_LINE, LineReader, Oversized, Pieces, _parse


def test_lines_split_across_chunks_come_out_whole() -> None:
    reader = LineReader(lambda: 100)
    assert reader.feed(b'{"a":') == []
    assert reader.feed(b'1}\n{"b"') == [b'{"a":1}']
    assert reader.feed(b":2}\n\n") == [b'{"b":2}', b""]
    assert reader.max_buffered == len(b'{"a":1}')


def test_a_line_past_the_limit_is_dropped_as_it_streams_and_the_next_line_is_read() -> None:
    reader = LineReader(lambda: 1000)
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    assert reader.feed(head) == []
    for _ in range(10_000):  # 1 MB more of the same line
        assert reader.feed(b"x" * 100) == []
    [over, nxt] = reader.feed(b'"}]}}\n{"jsonrpc":"2.0","id":8,"result":{}}\n')
    assert isinstance(over, Oversized) and over.size == len(head) + 1_000_000 + 5 and over.limit == 1000
    assert over.request_id() == 7 and over.head.startswith(head) and over.tail.endswith(b'"}]}}')
    assert nxt == b'{"jsonrpc":"2.0","id":8,"result":{}}'
    assert reader.max_buffered <= 1000


def test_the_request_id_is_found_at_the_end_where_typescript_writes_it() -> None:
    reader = LineReader(lambda: 10)
    [over] = reader.feed(b'{"result":{"content":[]},"jsonrpc":"2.0","id":"call-3"}\n')
    assert isinstance(over, Oversized) and over.request_id() == "call-3"
    [notification] = reader.feed(b'{"method":"notifications/message","params":{"data":"' + b"y" * 50 + b'"}}\n')
    assert isinstance(notification, Oversized) and notification.request_id() is None


def test_a_request_of_the_servers_is_not_taken_for_an_answer() -> None:
    reader = LineReader(lambda: 10)
    [request] = reader.feed(b'{"jsonrpc":"2.0","id":35,"method":"elicitation/create","params":{}}\n')
    assert isinstance(request, Oversized) and request.request_id() is None


def test_a_long_line_stays_in_its_pieces_until_it_is_parsed() -> None:
    """Joined where it is parsed (in a worker): joining 40 MB on the loop held every world about 15 ms."""
    reader = LineReader(lambda: 1 << 30)
    text = "x" * (2 * LARGE_LINE)
    line = json.dumps({"jsonrpc": "2.0", "id": 4, "result": {"content": [{"type": "text", "text": text}]}}).encode()
    pieces = [line[i:i + 4096] for i in range(0, len(line), 4096)]
    lines = [out for piece in pieces for out in reader.feed(piece)] + reader.feed(b"\n")
    [long] = lines
    assert isinstance(long, Pieces) and long.joined() == line
    parsed = _parse(long)
    assert parsed is not None and not isinstance(parsed, ValueError)
    assert parsed.message.result["content"][0]["text"] == text  # type: ignore[union-attr]
    assert reader.feed(b"{}\n") == [b"{}"]  # a short line comes whole
    assert _parse(Pieces((b" " * LARGE_LINE, b"  "))) is None  # a blank one is nothing
