"""An OpenAI-compatible HTTP server for tests: real sockets, programmable replies, every request recorded.

    with OpenAIDouble() as double:
        double.queue(Text("hello"), Status(500))
        client = AsyncOpenAI(api_key="test", base_url=double.base_url)

It runs on its own thread and event loop, so sync code, async tests and other processes can all use it.
Its endpoints under `/moved/` answer 307 to the same path without it: a provider that moved.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# Response types ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A plain text answer, streamed `chunk_size` characters per chunk, `delay` seconds apart."""

    text: str
    chunk_size: int = 4
    delay: float = 0.0


@dataclass(frozen=True)
class ToolCalls:
    """Tool calls given as (id, name, arguments_text); arguments are sent verbatim, in fragments."""

    calls: list[tuple[str, str, str]]
    interleave: bool = True  # alternate the fragments of several calls, as OpenAI does
    text: str | None = None  # text streamed before the calls
    chunk_size: int = 5


@dataclass(frozen=True)
class Status:
    """An HTTP error with an OpenAI-style `{"error": {...}}` body."""

    code: int = 500
    message: str = "The server had an error while processing your request."


@dataclass(frozen=True)
class Cut:
    """Streams `after_chunks` text chunks, then drops the connection: no finish_reason, no [DONE]."""

    after_chunks: int = 2
    text: str = "this answer never gets to the end"
    chunk_size: int = 4


@dataclass(frozen=True)
class Delay:
    """Waits `seconds` before sending `then` (to trigger client timeouts)."""

    seconds: float
    then: Response = field(default_factory=lambda: Text("ok"))


@dataclass(frozen=True)
class Malformed:
    """Streams `after_chunks` text chunks, then a `data:` line that is not JSON, then the normal end."""

    line: str = "{not json"
    after_chunks: int = 1
    text: str = "half an answer"
    chunk_size: int = 4


@dataclass(frozen=True)
class Stall:
    """Streams `after_chunks` text chunks, then only SSE comments (`: keep-alive`) every `every` seconds,
    for `seconds` (forever by default), then the rest of `then`: a stalled stream, or a slow first token."""

    seconds: float = float("inf")
    every: float = 0.5
    after_chunks: int = 0
    then: Text = field(default_factory=lambda: Text("late but here"))


Response = Text | ToolCalls | Status | Cut | Delay | Malformed | Stall
Responder = Callable[[dict[str, Any]], "Response | None"]


@dataclass(frozen=True)
class RecordedRequest:
    """One `POST /chat/completions` as the double received it (header names lower-cased)."""

    body: dict[str, Any]
    received_at: float
    headers: dict[str, str]


# Building chunks -------------------------------------------------------------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), max(1, size))]


def _usage(body: dict[str, Any], completion_tokens: int) -> dict[str, int]:
    """Deterministic fake token counts (about four characters a token)."""
    prompt = max(1, len(json.dumps(body.get("messages", []))) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def _tool_call_deltas(response: ToolCalls) -> list[dict[str, Any]]:
    """The `delta.tool_calls[0]` entries, in sending order."""
    fragments = [_pieces(args, response.chunk_size) or [""] for _, _, args in response.calls]
    if response.interleave:
        order = [(k, r) for r in range(max(map(len, fragments), default=0))
                 for k in range(len(fragments)) if r < len(fragments[k])]
    else:
        order = [(k, r) for k in range(len(fragments)) for r in range(len(fragments[k]))]
    deltas = []
    for k, r in order:
        call_id, name, _ = response.calls[k]
        delta: dict[str, Any] = {"index": k, "function": {"arguments": fragments[k][r]}}
        if r == 0:  # id, type and name arrive once, with the first fragment
            delta.update(id=call_id, type="function")
            delta["function"]["name"] = name
        deltas.append(delta)
    return deltas


def _stream_deltas(response: Text | ToolCalls | Cut | Malformed | Stall) -> tuple[list[dict[str, Any]], str | None]:
    """The `delta`s to stream and the finish_reason (None: the stream is cut after them)."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if isinstance(response, Stall):
        return _stream_deltas(response.then)
    if isinstance(response, Malformed):
        return deltas + [{"content": p} for p in _pieces(response.text, response.chunk_size)], "stop"
    if isinstance(response, Cut):
        pieces = _pieces(response.text, response.chunk_size)[:response.after_chunks]
        return deltas + [{"content": p} for p in pieces], None
    deltas += [{"content": p} for p in _pieces(response.text or "", response.chunk_size)]
    if isinstance(response, Text):
        return deltas, "stop"
    return deltas + [{"tool_calls": [d]} for d in _tool_call_deltas(response)], "tool_calls"


def _completion(body: dict[str, Any], response: Text | ToolCalls, rid: str) -> dict[str, Any]:
    """A non-streaming `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": response.text or None, "refusal": None}
    finish = "stop"
    if isinstance(response, ToolCalls):
        message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, n, a in response.calls]
        finish = "tool_calls"
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": _usage(body, len(_pieces(response.text or "", 4)) + 1)}


def _error_body(code: int, message: str) -> dict[str, Any]:
    kind = "server_error" if code >= 500 else "rate_limit_exceeded" if code == 429 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# The server -------------------------------------------------------------------------------------------------


class OpenAIDouble:
    """A real HTTP server on 127.0.0.1 speaking enough of the OpenAI API for chat completions."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self._cond = threading.Condition()  # guards everything below, shared with the server thread
        self._requests: list[RecordedRequest] = []
        self._queue: collections.deque[Response] = collections.deque()
        self._responder: Responder | None = None
        self._ids = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    # Programming and inspecting ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the chat completion requests received so far, oldest first."""
        with self._cond:
            return list(self._requests)

    def queue(self, *responses: Response) -> None:
        """Answer the next requests with these, in order (one per request)."""
        with self._cond:
            self._queue.extend(responses)

    def respond_with(self, fn: Responder | None) -> None:
        """Answer with `fn(body)` once the queue is empty; None from fn (or fn=None) means `Text("ok")`."""
        with self._cond:
            self._responder = fn

    def last_request(self) -> RecordedRequest | None:
        """The newest request (a responder can read when it arrived)."""
        with self._cond:
            return self._requests[-1] if self._requests else None

    def wait_for_requests(self, n: int, timeout: float = 15.0) -> list[RecordedRequest]:
        """Block until at least `n` requests arrived; TimeoutError otherwise. (A server's first LLM call
        imports the openai SDK first: seconds on a loaded machine, hence the generous default.)"""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests, got {len(self._requests)} in {timeout} s")
            return list(self._requests)

    async def wait_for_requests_async(self, n: int, timeout: float = 15.0) -> list[RecordedRequest]:
        """`wait_for_requests` without blocking the caller's event loop."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} requests, got {len(self.requests)} in {timeout} s")
            await asyncio.sleep(0.005)
        return self.requests

    # Lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> OpenAIDouble:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="openai-double", daemon=True)
        self._thread.start()
        self._started.wait(5)
        if self._error is not None:
            raise RuntimeError(f"OpenAI double failed to start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OpenAIDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            def done(task: asyncio.Task[None]) -> None:
                handlers.discard(task)
                writer.close()

            task = asyncio.ensure_future(on_connect(reader, writer))
            handlers.add(task)
            # A handler cancelled by stop() before it first ran never reaches its `finally`: its transport
            # was left open for a later test's gc to report (unclosed transport, laddr 127.0.0.1:<our port>).
            task.add_done_callback(done)

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await self._handle(reader, writer):
                    pass  # keep-alive: the next request on the same connection
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass  # the client went away: nothing to answer
            except asyncio.CancelledError:
                pass  # stop() cancelled us: the done callback closes the writer
            finally:
                writer.close()

        try:
            server = await asyncio.start_server(accept, self.host, self.port)
        except OSError as exc:
            self._error = exc
            self._started.set()
            return
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        async with server:
            await self._stop.wait()
            server.close()
            await asyncio.sleep(0.05)  # a connection accepted just now reaches accept() (two loop turns later)
            for task in list(handlers):  # e.g. a Delay still sleeping
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await asyncio.sleep(0)  # writer.close() closes the socket in a callback: let it run before the loop closes

    # HTTP ----------------------------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request; True when the connection may carry another (keep-alive, as real servers do)."""
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        raw = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        received_at = time.time()  # the whole request is here (before we spend time parsing it)
        path = path.split("?", 1)[0].rstrip("/")
        if path.startswith("/moved/"):  # an endpoint that moved (307: the request is sent again, as it was)
            writer.write(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {path[len('/moved'):]}\r\n"
                         f"Content-Length: 0\r\nConnection: keep-alive\r\n\r\n".encode())
            await writer.drain()
            return True
        if method == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": "double-model", "object": "model", "created": 0,
                                                  "owned_by": "openai-double"}]}
            await _send_json(writer, 200, models)
            return True
        if method != "POST" or path != "/v1/chat/completions":
            await _send_json(writer, 404, _error_body(404, f"no route {method} {path}"))
            return True
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            await _send_json(writer, 400, _error_body(400, f"invalid JSON body: {exc}"))
            return True
        response, rid = self._record(body, headers, received_at)
        while isinstance(response, Delay):
            await asyncio.sleep(response.seconds)
            response = response.then
        if isinstance(response, Status):
            await _send_json(writer, response.code, _error_body(response.code, response.message))
            return True
        if not body.get("stream"):
            if isinstance(response, (Malformed, Stall)):
                response = response.then if isinstance(response, Stall) else Text(response.text)
            if isinstance(response, Cut):
                return False  # closing without a word is the non-streaming way to be cut off
            await _send_json(writer, 200, _completion(body, response, rid))
            return True
        return await self._stream(writer, body, response, rid)

    def _record(self, body: dict[str, Any], headers: dict[str, str], received_at: float) -> tuple[Response, str]:
        """Store the request and pick its response: the queue first, then the responder, then "ok"."""
        with self._cond:
            self._requests.append(RecordedRequest(body, received_at, headers))
            self._ids += 1
            self._cond.notify_all()
            response = self._queue.popleft() if self._queue else None
            responder = self._responder
            rid = f"chatcmpl-double{self._ids}"
        if response is None and responder is not None:
            try:
                response = responder(body)
            except Exception as exc:  # a test's bug: answer loudly rather than hang up without a word
                logger.exception("OpenAI double: responder failed")
                response = Status(500, f"responder failed: {exc!r}")
        return response or Text("ok"), rid

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any],
                      response: Text | ToolCalls | Cut | Malformed | Stall, rid: str) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
        deltas, finish = _stream_deltas(response)
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model", "")}
        delay = response.delay if isinstance(response, Text) else 0.0
        misbehave_at = 1 + response.after_chunks if isinstance(response, (Malformed, Stall)) else None
        for i, delta in enumerate(deltas):
            if i == misbehave_at:
                await _misbehave(writer, response)
            if delay and i:
                await asyncio.sleep(delay)
            await _send_event(writer, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                                             "logprobs": None}]})
        if finish is None:  # Cut: hang up without the final zero-length chunk (close() still flushes)
            writer.close()
            return False
        await _send_event(writer, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish,
                                                         "logprobs": None}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await _send_event(writer, {**base, "choices": [], "usage": _usage(body, len(deltas))})
        await _send_event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def _misbehave(writer: asyncio.StreamWriter, response: Any) -> None:
    """A line that is not JSON (Malformed), or comments only for a while (Stall)."""
    if isinstance(response, Malformed):
        await _send_raw(writer, f"data: {response.line}\n\n")
        return
    deadline = time.monotonic() + response.seconds
    while time.monotonic() < deadline:
        await _send_raw(writer, ": keep-alive\n\n")
        await asyncio.sleep(min(response.every, max(0.0, deadline - time.monotonic())))


async def _send_raw(writer: asyncio.StreamWriter, text: str) -> None:
    payload = text.encode()
    writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
    await writer.drain()


async def _send_event(writer: asyncio.StreamWriter, data: dict[str, Any] | str) -> None:
    """One `data:` line of the event stream, as one HTTP chunk."""
    text = data if isinstance(data, str) else json.dumps(data)
    payload = f"data: {text}\n\n".encode()
    writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
    await writer.drain()


async def _send_json(writer: asyncio.StreamWriter, status: int, data: dict[str, Any]) -> None:
    payload = json.dumps(data).encode()
    writer.write(f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n".encode() + payload)
    await writer.drain()


def main(argv: list[str] | None = None) -> None:
    """`python -m server.testing.openai_double --port N`: serve the default behaviour until interrupted."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    with OpenAIDouble(args.host, args.port) as double:
        print(f"OpenAI double listening on {double.base_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
