"""A provider for the OpenAI Chat Completions API (and compatible servers), always streaming."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
import httpx2 as httpx
import openai
import orjson
from openai import AsyncStream
from openai.types.chat import ChatCompletion

from .. import offload
from ..aio import Slices, keep
from .base import LLMError, OnText, Reply, ToolCall, reply_too_long

logger = logging.getLogger(__name__)

# The end of a finished reply's stream ([DONE], then the end of the HTTP body, read so that its connection
# is reused) holds the event loop about 0.5 ms (the SDK's and httpx's end of a response). Read at once, it
# fell on the reply's write and its approval frame; so it is read once the caller is done with the reply
# (`Reply.finish`), or `_DRAIN_DELAY` seconds later for a caller that never says.
_DRAIN_DELAY = 0.1
_DRAIN_TIMEOUT = 10.0  # seconds a stream may take to end before its connection is dropped
_PIECE = 256 * 1024  # bytes of a large request body written in one step of the loop (about 0.1 ms)

# Status codes worth another try: timeouts, lock conflicts, rate limits (and every 5xx, checked apart).
_TRANSIENT_STATUS = frozenset({408, 409, 429})


@dataclass
class _PartialCall:
    """A tool call being assembled from streamed fragments."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIProvider:
    """Streams chat completions through `openai.AsyncOpenAI`; retries are the caller's (see retry.py)."""

    def __init__(self, api_key: str | None = None, base_url: str | None = None, timeout: float = 60) -> None:
        try:
            # max_retries=0: the SDK's own retries would replay text already streamed to clients. The SDK's
            # aiohttp transport (openai[aiohttp]) holds the event loop 0.5 ms less per request than its default
            # httpx2 one (0.74x, bench/llm_send.py): that is on the way from a tool's result to the next LLM call.
            self._client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0,
                                              http_client=openai.DefaultAioHttpClient(timeout=timeout))
        except openai.OpenAIError as exc:  # raised when no key is given nor in OPENAI_API_KEY
            raise LLMError(f"OpenAI client not configured: {exc}", transient=False) from None
        self._draining: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        """Close the underlying HTTP connections (and the streams still being read to their end)."""
        for task in tuple(self._draining):
            task.cancel()
        await asyncio.gather(*tuple(self._draining), return_exceptions=True)
        await self._client.close()

    def _finish_later(self, stream: AsyncStream[object]) -> Callable[[], None]:
        """Read the rest of a stream whose reply is complete later, while the turn goes on; returns the
        callable that has it read at once (`Reply.finish`)."""
        now = asyncio.Event()
        keep(self._draining, _drain(stream, now), "llm-stream-drain")
        return now.set

    async def _post_stream(self, body: dict[str, Any]) -> AsyncStream[object]:
        """`chat.completions.create(stream=True)` without its parameter transform.

        The SDK's transform walks every message through TypedDict introspection in pure Python:
        about 0.3 ms per message, blocking the event loop (100 ms for a 300-message context).
        Our messages are already plain API JSON, so we post them as they are, serialized by orjson
        (the SDK sends `content` as it is; its own encoder takes several times longer).
        """
        # Chunks come as the SDK parsed them from JSON (`object`), not built into its pydantic models:
        # that cost ~0.1-0.3 ms a chunk, on the path from the model's last tool-call chunk to the
        # approval. `_chunk_parts` checks the few fields we read.
        if not _is_large(body):
            return await self._client.post("/chat/completions", content=orjson.dumps(body), cast_to=ChatCompletion,
                                           stream=True, stream_cls=AsyncStream[object], options=_request_options())
        # A context that holds a 16 MiB tool result is encoded in a worker (60 ms of the loop otherwise), and
        # sent in pieces: given whole, aiohttp and the socket transport copied it three times in one step of
        # the loop (30-110 ms). Its length is given, so the body is sent as it would be whole (no chunked
        # encoding, which some compatible servers refuse).
        content = await offload.run(partial(orjson.dumps, body))
        return await self._client.post("/chat/completions", content=_Pieces(content), cast_to=ChatCompletion,
                                       stream=True, stream_cls=AsyncStream[object],
                                       options=_request_options({"Content-Length": str(len(content))}))

    async def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       on_text: OnText | None = None, first_token_timeout: float | None = None,
                       reply_limit: int | None = None) -> Reply:
        """One streamed chat completion; every failure becomes an `LLMError`.

        `first_token_timeout`: seconds until the first text or tool-call fragment. The HTTP timeout
        is per read, so a server that keeps the stream alive with SSE comments never trips it.
        """
        try:
            async with asyncio.timeout(first_token_timeout) as first_token:
                return await self._complete(model, messages, tools, on_text, first_token, reply_limit)
        except TimeoutError:
            raise LLMError(f"the LLM sent no first token within {first_token_timeout:g} s "
                           f"(llm_first_token_timeout)", transient=False) from None

    async def _complete(self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                        on_text: OnText | None, first_token: asyncio.Timeout, reply_limit: int | None) -> Reply:
        kwargs: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                                  "stream_options": {"include_usage": True}}
        if tools:  # an empty `tools` list is rejected by the API
            kwargs["tools"] = tools
        text: list[str] = []
        calls: dict[int, _PartialCall] = {}
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        size = 0  # characters of text and tool-call arguments so far: memory and storage follow it
        try:
            stream = await self._post_stream(kwargs)
            complete, finish = False, None
            slices = Slices()  # a fast model's chunks come many to a read: other worlds go on between them
            try:
                async for chunk in stream:
                    await slices.step()
                    chunk_usage, choices = _chunk_parts(chunk)
                    if chunk_usage is not None:
                        usage = chunk_usage
                    for choice in choices:
                        if choice.get("index", 0) != 0:  # we never ask for n > 1
                            continue
                        delta = _object(choice.get("delta") or {}, "delta")
                        content, fragments = delta.get("content"), delta.get("tool_calls") or []
                        if not isinstance(content, str | None) or not isinstance(fragments, list):
                            raise ValueError(f"a delta has a content or tool_calls of the wrong type: {delta!r:.200}")
                        if (content or fragments) and first_token.when() is not None:
                            first_token.reschedule(None)  # it came: from now on only the overall deadline
                        size += len(content or "")
                        for fragment in fragments:
                            fragment = _object(fragment, "tool call fragment")
                            size += _add_fragment(calls.setdefault(fragment.get("index", 0), _PartialCall()), fragment)
                        if reply_limit is not None and size > reply_limit:
                            raise reply_too_long(reply_limit)
                        if content:
                            text.append(content)
                            if on_text is not None:
                                await on_text(content)
                        if choice.get("finish_reason"):
                            finish_reason = str(choice["finish_reason"])
                    if finish_reason is not None and chunk_usage is not None and not choices:
                        # The reply and its final usage chunk are here; what follows is `[DONE]`. Waiting for it (and
                        # for the end of the body, read so that the connection is kept) cost the path from the
                        # model's last tool-call chunk to the approval 0.5-0.8 ms.
                        complete = True
                        break
            finally:
                if complete:
                    finish = self._finish_later(stream)
                else:
                    await stream.close()
        except openai.APIStatusError as exc:
            status = exc.status_code
            raise LLMError(f"LLM request failed with HTTP {status}: {_error_message(exc)}",
                           transient=status >= 500 or status in _TRANSIENT_STATUS) from exc
        except openai.APITimeoutError as exc:
            if (refused := _refused(exc)) is not None:  # the aiohttp transport maps a refused connection to a timeout
                raise LLMError(f"LLM connection failed: {refused}", transient=True) from exc
            raise LLMError("LLM request timed out", transient=True) from exc
        except openai.APIConnectionError as exc:
            # Also what a connection dropped in the middle of a stream looks like.
            raise LLMError(f"LLM connection failed: {exc.__cause__ or exc}", transient=True) from exc
        except openai.APIResponseValidationError as exc:
            raise LLMError(f"LLM sent a response we cannot read: {exc.message}", transient=False) from exc
        except openai.APIError as exc:
            # An `error` event inside an accepted stream: the server gave up half way.
            raise LLMError(f"LLM stream failed: {exc.message}", transient=True) from exc
        except httpx.TransportError as exc:  # a read failing mid-stream, outside the SDK's own wrapping
            raise LLMError(f"LLM connection failed: {type(exc).__name__}: {exc}", transient=True) from exc
        except ValueError as exc:  # e.g. `data: {not json`: the SDK's JSON error; a retry would get the same
            raise LLMError(f"LLM sent a stream we cannot read: {type(exc).__name__}: {exc}", transient=False) from exc
        except (TimeoutError, asyncio.CancelledError, LLMError):
            raise  # deadlines and cancellation belong to the caller; our own errors say what they mean
        except Exception as exc:  # whatever else the SDK raises: never an error the runner cannot show
            raise LLMError(f"LLM call failed: {type(exc).__name__}: {exc}", transient=False) from exc
        if finish_reason is None:
            raise LLMError("LLM stream ended without a finish_reason (cut off)", transient=True)
        tool_calls = [ToolCall(id=c.id or f"call_{secrets.token_hex(8)}", name=c.name, arguments="".join(c.arguments))
                      for _, c in sorted(calls.items())]
        return Reply(content="".join(text) or None, tool_calls=tool_calls, finish_reason=finish_reason, usage=usage,
                     finish=finish)


async def _drain(stream: AsyncStream[object], now: asyncio.Event) -> None:
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_DELAY):
                await now.wait()
        async with asyncio.timeout(_DRAIN_TIMEOUT):
            async for chunk in stream:
                logger.debug("ignored a chunk after the reply's usage: %.200r", chunk)
    except Exception as exc:  # the reply was whole: a stream that ends badly only costs its connection
        logger.debug("a finished LLM stream ended badly: %s: %s", type(exc).__name__, exc)
    finally:
        with contextlib.suppress(Exception):
            await stream.close()


def _refused(exc: BaseException) -> aiohttp.ClientConnectorError | None:
    """The connection error (refused, no such host) behind what the SDK reports as a timeout, if any."""
    cause = exc.__cause__ or exc.__context__
    for _ in range(10):  # a short chain: the SDK's error, the transport's, aiohttp's
        if cause is None or isinstance(cause, aiohttp.ClientConnectorError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _is_large(body: dict[str, Any]) -> bool:
    """Whether a request's messages hold over offload.HEAVY_JSON characters of text and tool-call arguments."""
    return sum(offload.size(message) for message in body.get("messages") or ()) > offload.HEAVY_JSON


class _Pieces:
    """`content` in `_PIECE`-byte pieces, the event loop free between them; iterable again, as a body
    sent again after a 307 or 308 redirect must be (a generator would be spent)."""

    def __init__(self, content: bytes) -> None:
        self._content = content

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self._content), _PIECE):
            yield self._content[start:start + _PIECE]
            await asyncio.sleep(0)


def _request_options(headers: dict[str, str] | None = None) -> Any:
    from openai._base_client import make_request_options

    return make_request_options(security={"bearer_auth": True}, extra_headers=headers)


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"a stream's {what} is not a JSON object: {value!r:.200}")
    return value


def _chunk_parts(chunk: object) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A streamed chunk's usage (None values dropped, at any depth) and its choices, checked to be objects."""
    chunk = _object(chunk, "chunk")
    usage, choices = chunk.get("usage"), chunk.get("choices") or []
    if not isinstance(choices, list):
        raise ValueError(f"a chunk's choices are not a list: {choices!r:.200}")
    return (None if usage is None else _without_none(_object(usage, "usage")),
            [_object(choice, "choice") for choice in choices])


def _without_none(value: dict[str, Any]) -> dict[str, Any]:
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in value.items() if v is not None}


def _add_fragment(call: _PartialCall, fragment: dict[str, Any]) -> int:
    """Merge one `delta.tool_calls[i]`: id and name come once, arguments in pieces (kept verbatim).
    Returns how many characters of arguments it added."""
    function = _object(fragment.get("function") or {}, "tool call function")
    call_id, name, arguments = fragment.get("id"), function.get("name"), function.get("arguments")
    if not all(isinstance(v, str | None) for v in (call_id, name, arguments)):
        raise ValueError(f"a tool call fragment has a field of the wrong type: {fragment!r:.200}")
    if call_id and not call.id:
        call.id = call_id
    if name and not call.name:
        call.name = name
    if arguments:
        call.arguments.append(arguments)
    return len(arguments or "")


def _error_message(exc: openai.APIStatusError) -> str:
    """The `error.message` of an OpenAI-style error body, else the SDK's message."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return exc.message
