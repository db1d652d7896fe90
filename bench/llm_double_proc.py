"""The OpenAI test double in its own process for benchmarks (no GIL shared with the server under test).

Answers a user message with one `bench_tool` call and a tool result with "ok"; prints
`PORT <n>` once, then `REQ <unix time>` as each request arrives (stamped once its body is in, before it is parsed).
"""
from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server.testing.openai_double import OpenAIDouble, Text, ToolCalls

_ids = itertools.count()


DOUBLE = OpenAIDouble()


def respond(body: dict[str, Any]) -> Any:
    request = DOUBLE.last_request()
    print(f"REQ {request.received_at if request else time.time():.6f}", flush=True)
    if body["messages"][-1]["role"] == "tool":
        return Text("ok", chunk_size=64)
    call_id = f"call_b{next(_ids)}"
    return ToolCalls([(call_id, "bench_tool", json.dumps({"id": call_id}))], interleave=False, chunk_size=256)


if __name__ == "__main__":
    with DOUBLE as double:
        double.respond_with(respond)
        print(f"PORT {double.base_url}", flush=True)
        threading.Event().wait()
