"""The LLM layer: the OpenAI provider through the real SDK against the HTTP double, retries, scripted agents."""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from typing import Any

import pytest

from server.llm.base import LLMError, Reply, ToolCall
from server.llm.openai_provider import OpenAIProvider
from server.llm.providers import DefaultProviders
from server.llm.retry import complete_with_retries
from server.llm.scripted import Call, Say, ScriptedProvider, demo_script
from server.testing.openai_double import Cut, Delay, Malformed, OpenAIDouble, Status, Text, ToolCalls

MESSAGES = [{"role": "system", "content": "You are alice."}, {"role": "user", "content": "hi", "name": "ann"}]
TOOLS = [{"type": "function", "function": {"name": "file_read", "description": "Read a file.",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


class TextSink:
    """Collects streamed deltas, and what a retry discarded."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.retries: list[tuple[int, LLMError]] = []

    async def on_text(self, delta: str) -> None:
        self.deltas.append(delta)

    async def on_retry(self, attempt: int, error: LLMError) -> None:
        self.retries.append((attempt, error))
        self.deltas.clear()


async def test_streams_text_deltas_in_order(llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Text("The quick brown fox jumps.", chunk_size=3))
    sink = TextSink()
    reply = await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=[], on_text=sink.on_text)
    assert sink.deltas == ["The", " qu", "ick", " br", "own", " fo", "x j", "ump", "s."]
    assert reply.content == "The quick brown fox jumps."
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"
    assert reply.usage is not None and reply.usage["total_tokens"] > 0


async def test_accumulates_interleaved_parallel_tool_calls_by_index(
        llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    first, second = '{"path": "a/very/long/name.txt"}', '{"command": "git status --short"}'
    llm_double.queue(ToolCalls([("call_1", "file_read", first), ("call_2", "shell_exec", second)],
                               interleave=True, text="Two things.", chunk_size=3))
    sink = TextSink()
    reply = await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=TOOLS, on_text=sink.on_text)
    assert reply.tool_calls == [ToolCall("call_1", "file_read", first), ToolCall("call_2", "shell_exec", second)]
    assert reply.content == "Two things." == "".join(sink.deltas)
    assert reply.finish_reason == "tool_calls"


async def test_keeps_malformed_arguments_verbatim(llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    broken = '{"path": "notes.md", oops'
    llm_double.queue(ToolCalls([("call_x", "file_read", broken)]))
    reply = await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=TOOLS)
    assert reply.content is None
    assert reply.tool_calls == [ToolCall("call_x", "file_read", broken)]


async def test_a_500_is_retried_then_succeeds(llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Status(500), Text("recovered"))
    sink = TextSink()
    reply = await complete_with_retries(openai_provider, model="gpt-test", messages=MESSAGES, tools=[],
                                        on_text=sink.on_text, on_retry=sink.on_retry, base_delay=0.01)
    assert reply.content == "recovered"
    assert [(attempt, error.transient) for attempt, error in sink.retries] == [(2, True)]
    assert "500" in str(sink.retries[0][1])
    assert len(llm_double.requests) == 2


async def test_a_cut_stream_raises_a_transient_error(llm_double: OpenAIDouble,
                                                     openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Cut(after_chunks=2, text="half an answer"))
    sink = TextSink()
    with pytest.raises(LLMError) as caught:
        await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=[], on_text=sink.on_text)
    assert caught.value.transient
    assert sink.deltas == ["half", " an "]  # what the caller must discard (on_retry)


async def test_a_cut_stream_is_discarded_and_retried(llm_double: OpenAIDouble,
                                                      openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Cut(after_chunks=1), Text("whole"))
    sink = TextSink()
    reply = await complete_with_retries(openai_provider, model="gpt-test", messages=MESSAGES, tools=[],
                                        on_text=sink.on_text, on_retry=sink.on_retry, base_delay=0.01)
    assert (reply.content, sink.deltas, len(sink.retries)) == ("whole", ["whol", "e"], 1)


async def test_a_400_is_not_retried(llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Status(400, "Invalid 'messages[1].content'"), Text("never sent"))
    sink = TextSink()
    with pytest.raises(LLMError) as caught:
        await complete_with_retries(openai_provider, model="gpt-test", messages=MESSAGES, tools=[],
                                    on_retry=sink.on_retry, base_delay=0.01)
    assert not caught.value.transient
    assert "Invalid 'messages[1].content'" in str(caught.value)
    assert sink.retries == [] and len(llm_double.requests) == 1


async def test_retries_give_up_after_the_last_attempt(llm_double: OpenAIDouble,
                                                       openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Status(503), Status(429), Status(502), Text("too late"))
    sink = TextSink()
    with pytest.raises(LLMError, match="502"):
        await complete_with_retries(openai_provider, model="gpt-test", messages=MESSAGES, tools=[],
                                    on_retry=sink.on_retry, attempts=3, base_delay=0.01)
    assert [attempt for attempt, _ in sink.retries] == [2, 3]
    assert len(llm_double.requests) == 3


async def test_a_timeout_is_transient(llm_double: OpenAIDouble) -> None:
    llm_double.queue(Delay(1.0, then=Text("late")))
    provider = OpenAIProvider(api_key="test", base_url=llm_double.base_url, timeout=0.2)
    try:
        with pytest.raises(LLMError, match="timed out") as caught:
            await provider.complete(model="gpt-test", messages=MESSAGES, tools=[])
    finally:
        await provider.aclose()
    assert caught.value.transient


async def test_a_refused_connection_says_so_rather_than_that_it_timed_out() -> None:
    """The SDK's aiohttp transport reports a refused connection as a connect timeout: a wrong base_url
    would send people looking for a slow LLM."""
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    provider = OpenAIProvider(api_key="test", base_url=f"http://127.0.0.1:{port}/v1", timeout=5)
    try:
        with pytest.raises(LLMError, match=f"LLM connection failed: .*127.0.0.1:{port}") as caught:
            await provider.complete(model="gpt-test", messages=MESSAGES, tools=[])
    finally:
        await provider.aclose()
    assert caught.value.transient and "timed out" not in str(caught.value)


async def test_the_double_records_what_the_llm_was_sent(llm_double: OpenAIDouble,
                                                        openai_provider: OpenAIProvider) -> None:
    before = time.time()
    await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=TOOLS)
    await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=[])
    first, second = await llm_double.wait_for_requests_async(2)
    assert first.body["model"] == "gpt-test"
    assert first.body["messages"] == MESSAGES
    assert first.body["tools"] == TOOLS
    assert "tools" not in second.body  # an empty list is omitted, not sent
    assert first.body["stream"] is True and first.body["stream_options"] == {"include_usage": True}
    assert first.headers["authorization"] == "Bearer test"
    assert first.headers["content-type"] == "application/json"
    assert before <= first.received_at <= second.received_at <= time.time()


def test_the_double_answers_plain_http_and_programmed_responders() -> None:
    import httpx2

    with OpenAIDouble() as double:
        double.respond_with(lambda body: Text(f"echo {body['messages'][-1]['content']}"))
        with httpx2.Client(base_url=double.base_url) as http:
            assert http.get("/models").json()["data"][0]["id"] == "double-model"
            answer = http.post("/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                       "content": "ping"}]})
            assert answer.json()["choices"][0]["message"]["content"] == "echo ping"
            stream = http.post("/chat/completions", json={"model": "m", "stream": True,
                                                          "messages": [{"role": "user", "content": "hi"}]})
            broken = http.post("/chat/completions", json={"model": "m", "messages": []})
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in stream.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[1][len("data: "):])["object"] == "chat.completion.chunk"
        assert broken.status_code == 500 and "IndexError" in broken.json()["error"]["message"]
        assert len(double.wait_for_requests(3, timeout=1)) == 3
        with pytest.raises(TimeoutError):
            double.wait_for_requests(4, timeout=0.05)


# The scripted provider ---------------------------------------------------------------------------------------


async def test_the_scripted_provider_is_deterministic() -> None:
    def script(messages: list[dict[str, Any]]) -> Any:
        return [Say("Reading both files now."), Call("file_read", {"path": "a"}), Call("file_read", {"path": "b"})]

    provider = ScriptedProvider(script)
    sink = TextSink()
    first = await provider.complete(model="script", messages=MESSAGES, tools=[], on_text=sink.on_text)
    second = await provider.complete(model="script", messages=list(MESSAGES), tools=[])
    assert first == second
    assert sink.deltas == ["Reading ", "both ", "files ", "now."]
    assert [c.id for c in first.tool_calls] == ["call_s2_0", "call_s2_1"]
    assert json.loads(first.tool_calls[1].arguments) == {"path": "b"}
    longer = await provider.complete(model="script", messages=[*MESSAGES, {"role": "user", "content": "more"}],
                                     tools=[])
    assert [c.id for c in longer.tool_calls] == ["call_s3_0", "call_s3_1"]


async def _run_tools(provider: ScriptedProvider, messages: list[dict[str, Any]], results: dict[str, str],
                     sink: TextSink) -> Reply:
    """One LLM step; answers its tool calls from `results` (by tool name) like the engine would."""
    reply = await provider.complete(model="script", messages=messages, tools=[], on_text=sink.on_text)
    messages.append({"role": "assistant", "content": reply.content,
                     **({"tool_calls": [c.to_openai() for c in reply.tool_calls]} if reply.tool_calls else {})})
    for call in reply.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.name]})
    return reply


async def test_the_demo_alice_asks_to_run_a_command_then_hands_over_to_bob() -> None:
    alice = ScriptedProvider(demo_script("alice"))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are alice."},
                                      {"role": "user", "content": "What's in the workspace?", "name": "ann"}]
    listing = "total 8\ndrwxr-xr-x 2 u u 4096 .\ndrwxr-xr-x 3 u u 4096 ..\n-rw-r--r-- 1 u u 12 notes.md\n"
    sink = TextSink()
    result = json.dumps({"exit_code": 0, "output": listing, "truncated": False, "timed_out": False})
    first = await _run_tools(alice, messages, {"shell_exec": result}, sink)
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("shell_exec", {"command": "ls -la"})]
    summary = await _run_tools(alice, messages, {}, sink)
    assert summary.tool_calls == [] and summary.content is not None
    assert "has 1 entry: notes.md" in summary.content  # . and .. are not entries
    assert "notes.md" in summary.content.split("\n\n")[0]
    assert summary.content.split("\n\n")[-1].startswith("@bob ")
    denied = [*messages[:3], {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                              "content": json.dumps({"error": "denied by ann"})}]
    polite = await alice.complete(model="script", messages=denied, tools=[])
    assert "denied by ann" in (polite.content or "")
    assert (polite.content or "").split("\n\n")[-1].startswith("@bob ")


async def test_the_demo_bob_reads_notifies_then_answers_without_mentions() -> None:
    bob = ScriptedProvider(demo_script("bob"), chunk_words=2)
    messages: list[dict[str, Any]] = [{"role": "user", "name": "alice",
                                       "content": "Done.\n\n@bob could you read notes.md?"}]
    results = {"file_read": "# Plan\nShip on Friday.\n", "ui_notify": json.dumps({"ok": True})}
    sink = TextSink()
    steps = [await _run_tools(bob, messages, results, sink) for _ in range(3)]
    assert [[(c.name, json.loads(c.arguments)) for c in s.tool_calls] for s in steps[:2]] == [
        [("file_read", {"path": "notes.md"})], [("ui_notify", {"message": "bob read notes.md (2 lines)"})]]
    final = steps[2]
    assert final.tool_calls == [] and final.finish_reason == "stop"
    assert "Plan" in (final.content or "") and "@" not in (final.content or "")
    assert final.content is not None and final.content in "".join(sink.deltas)


async def test_other_demo_agents_reply_politely_and_mention_nobody() -> None:
    carol = ScriptedProvider(demo_script("carol"))
    reply = await carol.complete(model="script", messages=[{"role": "user", "content": "hey @carol", "name": "ann"}],
                                 tools=[])
    assert reply.tool_calls == [] and "carol" in (reply.content or "") and "@" not in (reply.content or "")


@pytest.mark.parametrize("line", ['{"choices": [{"index": 0, "delta": {"content": 42}}]}',
                                  '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": 7}]}}]}',
                                  '{"choices": {"index": 0}}', '[1, 2]', '{"usage": "lots"}'])
async def test_a_chunk_with_fields_of_the_wrong_type_is_a_clear_error(
        line: str, llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    """Chunks are read as plain JSON (not the SDK's models): what we read is checked, never passed on."""
    llm_double.queue(Malformed(line=line))
    with pytest.raises(LLMError, match="LLM sent a stream we cannot read") as caught:
        await openai_provider.complete(model="m", messages=[{"role": "user", "content": "hi"}], tools=[])
    assert not caught.value.transient


class HeldDoneServer:
    """An OpenAI-style stream that sends a tool call, its finish_reason and usage, then holds `[DONE]` and the
    end of the body until `release` is set; it counts the connections it was asked on."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.connections = 0
        self.requests = 0
        self.closed = asyncio.Event()  # a connection was closed by the client

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        self.release.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                self.requests += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                call = {"index": 0, "id": "call_held", "type": "function",
                        "function": {"name": "file_read", "arguments": '{"path": "a"}'}}
                for chunk in ({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
                              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                        "total_tokens": 5}}):
                    payload = f"data: {json.dumps(chunk)}\n\n".encode()
                    writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                await writer.drain()
                # Hold the rest until released, or notice that the client hung up meanwhile.
                hung_up = asyncio.ensure_future(reader.read(1))
                released = asyncio.ensure_future(self.release.wait())
                await asyncio.wait([hung_up, released], return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
                if hung_up.done() and not hung_up.result():
                    raise ConnectionError("the client hung up")
                hung_up.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await hung_up
                payload = b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


async def test_a_reply_is_returned_once_its_usage_came_and_the_connection_is_kept() -> None:
    server = HeldDoneServer()
    async with server as base_url, asyncio.timeout(10):
        provider = OpenAIProvider(api_key="test", base_url=base_url)
        try:
            # Returned while the server still holds [DONE]: the turn does not wait for it.
            reply = await provider.complete(model="m", messages=MESSAGES, tools=TOOLS)
            assert reply.tool_calls == [ToolCall("call_held", "file_read", '{"path": "a"}')]
            assert reply.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            server.release.set()  # the rest is read beside the turn, so the next call reuses the connection
            assert reply.finish is not None
            reply.finish()  # the caller is done with the reply: read it now rather than 0.1 s later
            await asyncio.gather(*(t for t in asyncio.all_tasks() if t.get_name() == "llm-stream-drain"))
            await provider.complete(model="m", messages=MESSAGES, tools=TOOLS)
            assert (server.requests, server.connections) == (2, 1)
        finally:
            await provider.aclose()


async def test_closing_the_provider_drops_a_stream_still_being_read() -> None:
    server = HeldDoneServer()
    async with server as base_url, asyncio.timeout(10):
        provider = OpenAIProvider(api_key="test", base_url=base_url)
        await provider.complete(model="m", messages=MESSAGES, tools=TOOLS)
        await provider.aclose()  # does not wait for the [DONE] that never comes
        await server.closed.wait()


async def test_a_reply_longer_than_its_limit_is_a_clear_error_and_is_read_no_further(
        llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    llm_double.queue(Text("x" * 5000, chunk_size=100))
    sink = TextSink()
    with pytest.raises(LLMError, match=r"passed 1000 characters \(llm_reply_limit\)") as raised:
        await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=[], on_text=sink.on_text,
                                       reply_limit=1000)
    assert not raised.value.transient  # the same request would bring the same reply
    assert len("".join(sink.deltas)) <= 1000  # nothing past the limit was passed on


async def test_tool_call_arguments_count_toward_the_reply_limit(
        llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    arguments = json.dumps({"path": "p" * 3000})
    llm_double.queue(ToolCalls([("call_1", "file_read", arguments)], chunk_size=50))
    with pytest.raises(LLMError, match="llm_reply_limit"):
        await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=TOOLS, reply_limit=1000)
    llm_double.queue(ToolCalls([("call_1", "file_read", arguments)], chunk_size=50))
    reply = await openai_provider.complete(model="gpt-test", messages=MESSAGES, tools=TOOLS, reply_limit=4000)
    assert reply.tool_calls[0].arguments == arguments


async def test_the_scripted_provider_keeps_the_reply_limit_too() -> None:
    provider = ScriptedProvider(lambda messages: [Say("y" * 600), Call("file_read", {"path": "q" * 600})])
    with pytest.raises(LLMError, match="llm_reply_limit"):
        await provider.complete(model="m", messages=MESSAGES, tools=TOOLS, reply_limit=1000)
    reply = await provider.complete(model="m", messages=MESSAGES, tools=TOOLS, reply_limit=2000)
    assert reply.content == "y" * 600


async def test_a_context_over_a_megabyte_reaches_the_llm_whole_with_its_length(
        llm_double: OpenAIDouble, openai_provider: OpenAIProvider) -> None:
    # Encoded in a worker and written in pieces (server/llm/openai_provider.py): the double reads exactly
    # Content-Length bytes, so a chunked body, or a piece lost or repeated, fails here.
    result = "".join(f"line {n}: ünïcode and ASCII\n" for n in range(60_000))  # 1.7 MB
    call = {"id": "call_1", "type": "function", "function": {"name": "file_read", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": result}]
    llm_double.queue(Text("Read it."))
    reply = await openai_provider.complete(model="gpt-test", messages=messages, tools=TOOLS)
    assert reply.content == "Read it."
    request = llm_double.last_request()
    assert request is not None
    assert request.body["messages"] == messages
    assert "transfer-encoding" not in request.headers


async def test_a_large_context_is_sent_again_whole_to_a_provider_that_moved(llm_double: OpenAIDouble) -> None:
    # A 307 has the client send the same body again: a body of pieces must be iterable twice.
    moved = OpenAIProvider(api_key="x", base_url=llm_double.base_url.replace("/v1", "/moved/v1"))
    messages = [*MESSAGES, {"role": "user", "content": "z" * 1_200_000}]
    try:
        reply = await moved.complete(model="gpt-test", messages=messages, tools=[])
    finally:
        await moved.aclose()
    assert reply.content == "ok"
    request = llm_double.last_request()
    assert request is not None and request.body["messages"] == messages


async def test_concurrent_first_calls_to_an_endpoint_make_one_client(
        llm_double: OpenAIDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    import server.llm.openai_provider as module

    made: list[str | None] = []

    class Counted(OpenAIProvider):
        def __init__(self, api_key: str | None = None, base_url: str | None = None, timeout: float = 60) -> None:
            made.append(base_url)
            super().__init__(api_key=api_key, base_url=base_url, timeout=timeout)

    monkeypatch.setattr(module, "OpenAIProvider", Counted)
    providers = DefaultProviders()
    provider = providers({"provider": "openai", "name": "alice", "base_url": llm_double.base_url})
    try:
        replies = await asyncio.gather(*(provider.complete(model="gpt-test", messages=MESSAGES, tools=[])
                                         for _ in range(5)))
    finally:
        await providers.aclose()
    assert [reply.content for reply in replies] == ["ok"] * 5
    assert made == [llm_double.base_url]
