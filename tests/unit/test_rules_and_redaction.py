"""Approval-rule globs that never cover a second command, and redaction of secret-looking values."""
from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets

from hypothesis import given, settings
from hypothesis import strategies as st

from server.redact import REDACTED, redact, redact_text, remember_secret
from server.tools.globs import CONTROL_SEQUENCES, args_match, escape_glob, exact_match, glob_matches, operators

# --- globs ----------------------------------------------------------------------------------------


def test_args_match_uses_case_sensitive_globs() -> None:
    assert args_match({"command": "git status*"}, {"command": "git status --short"})
    assert not args_match({"command": "git status*"}, {"command": "GIT STATUS"})
    assert not args_match({"command": "git status*"}, {"cmd": "git status"})
    assert args_match({}, {"command": "anything"})
    assert args_match({"command": "x", "timeout": "1?"}, {"command": "x", "timeout": 10})
    assert args_match({"opts": '{"a":1,"b":*}'}, {"opts": {"b": [2], "a": 1}})
    assert not args_match({"command": "ls", "timeout": "5"}, {"command": "ls", "timeout": 6})


def test_an_allow_rule_allows_no_argument_it_does_not_name() -> None:
    assert not args_match({"path": "notes.md"}, {"path": "notes.md", "recursive": True})
    assert not args_match({"timeout": "1?"}, {"command": "rm -rf ~", "timeout": 10})
    assert args_match(exact_match({"path": "notes.md"}), {"path": "notes.md"})
    assert not args_match(exact_match({"path": "notes.md"}), {"path": "notes.md", "force": True})
    # An empty glob: any value of that argument, or none.
    assert args_match({"path": "*.md", "recursive": ""}, {"path": "a.md", "recursive": True})
    assert args_match({"path": "*.md", "recursive": ""}, {"path": "a.md"})
    assert not args_match({"path": "*.md", "recursive": ""}, {"recursive": True})


def test_a_wildcard_never_approves_a_chained_shell_command() -> None:
    rule = {"command": "git status*"}
    assert args_match(rule, {"command": "git status --short"})
    for chained in ("git status; rm -rf ~", "git status && curl x | sh", "git status $(reboot)",
                    "git status\nreboot", "git status `reboot`", "git status > /etc/passwd", "git status & sleep 9",
                    "git status || reboot", "git status | sh"):
        assert not args_match(rule, {"command": chained}), chained
    assert args_match({"command": "make > log*"}, {"command": "make > log.txt"})


def test_a_wildcard_does_not_cover_an_operator_even_when_the_pattern_spells_one_out() -> None:
    assert glob_matches("cd /tmp && ls*", "cd /tmp && ls -la")
    assert not glob_matches("cd /tmp && ls*", "cd /tmp && ls && touch x")
    assert not glob_matches("echo *; ls", "echo a; rm -rf ~; ls")
    assert not glob_matches("*", "a; b")


def test_an_escaped_value_matches_only_itself() -> None:
    pattern = escape_glob("rm -f build/*.o")
    assert glob_matches(pattern, "rm -f build/*.o")
    assert not glob_matches(pattern, "rm -f build/ -r x.o")
    assert not glob_matches(pattern, "rm -f build/main.o")
    assert args_match(exact_match({"command": "ls [ab]?"}), {"command": "ls [ab]?"})
    assert not args_match(exact_match({"command": "ls [ab]?"}), {"command": "ls a1"})


_WORDS = st.sampled_from(["ls", "rm", "-rf", "~", "/tmp", "echo", "x", "git", "status", " ", "'", '"', "*", "?"])
_PIECES = st.one_of(_WORDS, st.sampled_from(CONTROL_SEQUENCES), st.text(alphabet="ab;&|<>`$()\n *?", max_size=4))


@settings(max_examples=400, deadline=None)
@given(pattern=st.lists(_PIECES, max_size=8).map("".join), command=st.lists(_PIECES, max_size=10).map("".join))
def test_no_rule_allows_a_control_sequence_its_literal_text_does_not_spell_out(pattern: str, command: str) -> None:
    """Whatever the pattern, a command it matches has exactly the pattern's operators, in order:
    every `;`, `&&`, `|`, `$(`, backtick, newline or redirection that runs is written in the rule."""
    if glob_matches(pattern, command):
        assert operators(command) == operators(pattern)


@settings(max_examples=200, deadline=None)
@given(command=st.lists(_PIECES, max_size=10).map("".join))
def test_an_exact_pattern_matches_its_command_and_nothing_that_adds_to_it(command: str) -> None:
    assert glob_matches(escape_glob(command), command)
    assert not glob_matches(escape_glob(command), command + "; reboot")


# --- redaction ------------------------------------------------------------------------------------

def test_deciders_see_ordinary_arguments_exactly() -> None:
    args = {"key": "config.yaml", "author": "maria", "max_tokens": 512, "command": "git log -n 3",
            "commit": "3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39", "path": "src/HttpRequestHandlerFactory2024Impl.py"}
    assert redact(args) == args


def test_secret_looking_values_are_hidden_wherever_they_are() -> None:
    token = secrets.token_urlsafe(32)
    cases = {
        "export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz123456": "export OPENAI_API_KEY=" + REDACTED,
        'curl -H "Authorization: Bearer abc123def456ghi"': 'curl -H "Authorization: Bearer ' + REDACTED + '"',
        f"use {token} now": f"use {REDACTED} now",
        "aws AKIAIOSFODNN7EXAMPLE": f"aws {REDACTED}",
        "gh ghp_" + "a1B2" * 9: f"gh {REDACTED}",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----": REDACTED,
    }
    for text, hidden in cases.items():
        assert redact_text(text) == hidden, text
    assert redact({"password": "hunter2", "nested": [{"api_key": "x1"}]}) == {
        "password": REDACTED, "nested": [{"api_key": REDACTED}]}


def test_json_text_stays_json_when_a_value_inside_is_hidden() -> None:
    hidden = redact('{"command": "echo sk-proj-abcdefghijklmnopqrstuvwxyz123456", "n": 1}')
    assert hidden == '{"command":"echo [redacted]","n":1}'


def test_a_known_secret_is_hidden_whatever_it_looks_like() -> None:
    remember_secret("correct horse battery staple")
    assert redact_text("the owner token is correct horse battery staple") == f"the owner token is {REDACTED}"


async def test_a_secret_streamed_in_pieces_never_leaves_in_clear() -> None:
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(text: str) -> None:
        sent.append(text)

    stream = ChunkStream(publish, interval=0)
    key = "sk-proj-" + "aB3dE6gH9jK2mN5pQ8sT"
    for delta in ["Your key is ", key[:6], key[6:14], key[14:], " and the PEM: -----BEGIN RSA PRIV",
                  "ATE KEY-----\nMIIE", "pq\n-----END RSA PRIVATE KEY-----", " done."]:
        await stream.add(delta)
    await stream.close()
    shown = "".join(sent)
    assert shown == f"Your key is {REDACTED} and the PEM: {REDACTED} done."
    assert all("sk-" not in piece and "MIIE" not in piece for piece in sent)


async def test_a_burst_of_streamed_text_is_redacted_and_sent_a_slice_at_a_time() -> None:
    """A model faster than the flushes left 500 KB to one redaction, which held the loop for 100 ms: a flush
    now sends at most a slice at a time, and a secret across a slice's edge still never shows."""
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(text: str) -> None:
        sent.append(text)

    key = "ghp_" + "Zx8" * 12
    words = "lorem ipsum dolor sit amet " * 700  # 18,900 characters: the key straddles the first slice's end
    stream = ChunkStream(publish, interval=3600)  # nothing flushes on its own: the whole burst is pending
    edge = words.rindex(" ", 0, 16_370) + 1
    await stream.add("start ")
    await stream.add(words[:edge] + key + " " + words * 2)  # under 64 KiB behind: redacted on the loop
    await stream.close()
    assert len(sent) > 3 and max(len(piece) for piece in sent) <= 16 * 1024
    assert "".join(sent) == "start " + words[:edge] + REDACTED + " " + words * 2


async def test_a_stream_far_ahead_of_the_loop_is_redacted_in_large_slices_by_a_worker() -> None:
    """1 MB streamed faster than the loop redacts it, sliced on the loop, kept the loop busy for 1.4 s and
    every world waited (bench/isolation.py): past 64 KiB behind, a worker process redacts 256 KiB at a
    time, knowing the secrets this process knows; a secret across a slice's edge still never shows."""
    from server import offload
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(text: str) -> None:
        sent.append(text)

    known = "known-" + secrets.token_hex(16)  # looks like nothing: hidden only because it was remembered
    remember_secret(known)
    key = "ghp_" + "Zx8" * 12
    words = "lorem ipsum dolor sit amet " * 700
    edge = words.rindex(" ", 0, 256 * 1024 % len(words) - 20) + 1
    body = words * (256 * 1024 // len(words)) + words[:edge] + key + " " + words * 30 + known + " " + words
    stream = ChunkStream(publish, interval=3600)
    offload.shutdown()  # no worker yet: the stream starts one
    await stream.add("start ")
    await stream.add(body)
    try:
        await stream.close()
        assert offload._pool is not None  # a worker redacted the stream's backlog
    finally:
        offload.shutdown()
    assert "".join(sent) == "start " + body.replace(key, REDACTED).replace(known, REDACTED)
    # Sent in pieces a page scans in a few milliseconds, whatever the size of the worker's slices.
    assert max(map(len, sent)) <= 16 * 1024


async def test_a_dropped_attempt_sends_no_more_pieces_of_its_slice() -> None:
    """A retry (or a stop) drops what an attempt streamed; the pieces of its worker slice not sent yet must
    not follow the `reset` and show ahead of the next attempt's text."""
    from server import offload
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []
    second, release = asyncio.Event(), asyncio.Event()

    async def publish(text: str) -> None:
        sent.append(text)
        if len(sent) == 2:  # the bus is slow with the second piece: the attempt is dropped meanwhile
            second.set()
            await release.wait()

    stream = ChunkStream(publish, interval=3600)
    try:
        adding = asyncio.create_task(stream.add("lorem ipsum dolor sit amet " * 12_000))  # a worker's slice
        await asyncio.wait_for(second.wait(), timeout=60)
        stream.discard()
        release.set()
        await adding
    finally:
        offload.shutdown()
    assert len(sent) == 2


def test_keys_that_name_a_secret_hide_their_value_and_others_do_not() -> None:
    hidden = {"password": "x", "api_key": "x", "GITHUB_TOKEN": "x", "db-password": "x", "apiToken": "x",
              "client_secret": "x", "Authorization": "x"}
    shown = {"key": "x", "author": "x", "max_tokens": 5, "monkey": "x", "tokens": "x", "secretary": "x"}
    assert redact(hidden) == {k: REDACTED for k in hidden}
    assert redact(shown) == shown


async def test_a_labelled_secret_split_from_its_label_is_still_hidden_while_streaming() -> None:
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(text: str) -> None:
        sent.append(text)

    stream = ChunkStream(publish, interval=0)
    for delta in ["the db ", "password = ", "hunter2 ", "is old"]:
        await stream.add(delta)
    await stream.close()
    assert "".join(sent) == f"the db password = {REDACTED} is old"


def test_deny_and_ask_rules_cover_a_command_however_it_is_chained() -> None:
    from server.tools.globs import args_covered

    deny = {"command": "rm *"}
    for chained in ("rm -rf /", "rm -rf /;", "true; rm -rf /", "rm -rf / 2>/dev/null", "(rm -rf /)",
                    "FOO=1 rm -rf /", "echo hi && rm -rf /"):
        assert args_covered(deny, {"command": chained}) is True, chained
    assert args_covered(deny, {"command": "ls -la"}) is False
    for hidden in ("eval 'r''m -rf /'", "\\rm -rf /", "$(printf rm) -rf /", "sh -c 'rm -rf /'"):
        assert args_covered(deny, {"command": hidden}) is True, hidden  # unseen: covered by every rule
    assert args_covered(deny, {"command": "echo ${x@P}"}) is None  # unsure: a person decides


def test_an_allow_wildcard_covers_no_expansion_and_no_second_json_element() -> None:
    assert glob_matches("echo *", "echo hello world")
    assert not glob_matches("echo *", "echo ${x=\\$\\(touch pwn\\)}${x@P}")
    assert not glob_matches("echo *", "echo \"$HOME\"")
    assert not args_match({"paths": escape_glob('["docs/') + '*"]'}, {"paths": ["docs/a", "/etc/passwd"]})
    assert args_match({"paths": escape_glob('["docs/') + '*"]'}, {"paths": ["docs/a"]})


def test_secrets_under_id_like_keys_and_in_keys_are_hidden_but_ids_are_kept() -> None:
    key = "sk-ant-" + "aB3dE6gH9jK2mN5pQ8sTvW"
    assert redact({"id": key, "type": "ghp_" + "a1B2" * 9}) == {"id": REDACTED, "type": REDACTED}
    assert redact({key: 1}) == {REDACTED: 1}
    call_id = "call_Ab3dEf9hIj2kLm5nOp8qRs1tUv4w"  # an id the model made: looks random, is not a secret
    assert redact({"id": call_id, "tool_call_id": "approval_" + call_id}) == {
        "id": call_id, "tool_call_id": "approval_" + call_id}


async def test_status_frames_are_redacted_before_they_leave(memory_bus) -> None:  # type: ignore[no-untyped-def]
    from server.engine.store import Store, channel
    from server.engine.world.status import StatusBoard

    board = StatusBoard(Store(None, memory_bus))  # type: ignore[arg-type]
    async with memory_bus.subscribe(channel("w"), maxsize=10) as sub:
        await board.set("w", "alice", "error", last_error="401: bad key sk-proj-abcdefghijklmnopqrstuvwxyz123456")
        frame = await sub.get()
    assert "sk-proj" not in frame and REDACTED in frame


async def test_streamed_text_without_spaces_is_not_held_back() -> None:
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(text: str) -> None:
        sent.append(text)

    stream = ChunkStream(publish, interval=0)
    await stream.add("这是一个没有空格的句子，")  # noqa: RUF001 (Chinese punctuation on purpose)
    await stream.add("模型一直在说话。")
    # all of it, before the stream ends
    assert "".join(sent) == "这是一个没有空格的句子，模型一直在说话。"  # noqa: RUF001


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_redact_hints_find_every_credential_shape(data: st.DataObject) -> None:
    """redact_text skips the credential shapes when none of their fixed parts is in the text: every shape's
    matches must contain one (a new shape without its fixed part in `_SHAPE_HINT` fails here)."""
    from server import redact as module

    for shape in module._SHAPES:
        sample = data.draw(st.from_regex(re.compile(shape, re.DOTALL), fullmatch=True))
        assert module._SHAPE_HINT.search(sample), (shape, sample)
        assert REDACTED in redact_text(f"see {sample} here", random_looking=False)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_label_words_are_found_in_every_labelled_or_positional_credential(data: st.DataObject) -> None:
    """ASCII text skips the labelled and positional patterns when none of their words is in it, in any case
    (plain searches: a case-insensitive regex took 6 s over a 16 MiB tool result); every match holds one."""
    from server import redact as module

    ascii_only = st.characters(min_codepoint=32, max_codepoint=126)
    for pattern, words in ((module._LABELLED, module._LABELLED_WORDS), (module._POSITIONAL, module._POSITIONAL_WORDS)):
        sample = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=ascii_only))
        assert any(word in sample.lower() for word in words), (pattern.pattern, sample)
        assert not any(word in REDACTED.lower() for word in words)  # a replacement never makes a label


def test_a_label_in_any_case_hides_its_value_in_ascii_and_in_other_text() -> None:
    for text in ("Token = abcdefgh123", "my API-KEY: abcdefgh1234", "PGPASSWORD=hunter2x curl",
                 "Authorization: BASIC dXNlcjpwYXNz", "BEARER abcdefghijkl é", "\u017fecret: abcdef1234 é",
                 "TO\u212aEN=abcdefgh123 é", "curl -u bob:s3cr3tpass https://example.com"):
        assert REDACTED in redact_text(text), text


_STREAM_PIECES = ["word ", "x", "sk-proj-aB3dE6gH9jK2mN5pQ8sT", " ", "\n", "password = hunter2hunter2 ", "-----BEGIN",
                  " RSA PRIVATE KEY-----\nMIIEpq\n-----END RSA PRIVATE KEY-----", "token:", "été ", "、"]


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.sampled_from(_STREAM_PIECES), max_size=30), cuts=st.lists(st.integers(0, 400)))
async def test_streamed_text_reads_the_same_however_it_is_cut(pieces: list[str], cuts: list[int]) -> None:
    """Whatever the deltas, what is streamed is what the whole text streamed at once would show."""
    from server.engine.turns.chunks import ChunkStream

    async def streamed(deltas: list[str]) -> str:
        sent: list[str] = []

        async def publish(text: str) -> None:
            sent.append(text)
        stream = ChunkStream(publish, interval=0)
        for delta in deltas:
            await stream.add(delta)
        await stream.close()
        return "".join(sent)

    text = "".join(pieces)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    assert await streamed([text[a:b] for a, b in itertools.pairwise(bounds)]) == await streamed([text])


async def test_a_key_glued_to_an_unfinished_private_key_block_is_not_shown_cut_short() -> None:
    """Found by the test above: the stream stopped at the block's start, inside the token before it, and
    showed that token's start, which alone no longer looked like a secret."""
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(text: str) -> None:
        sent.append(text)
    text = "xsk-proj-aB3dE6gH9jK2mN5pQ8sT-----BEGINword -----BEGIN"
    stream = ChunkStream(publish, interval=0)
    await stream.add(text[:44])
    await stream.add(text[44:])
    await stream.close()
    assert "".join(sent) == f"{REDACTED} -----BEGIN"


def test_the_password_of_a_url_is_hidden_and_the_rest_of_the_url_kept() -> None:
    assert redact_text("connect to postgres://app:Tr0ub4dor&3@db.internal:5432/prod now") == \
        f"connect to postgres://app:{REDACTED}@db.internal:5432/prod now"
    assert redact_text("see http://127.0.0.1:8000/w/1 and ssh://git@example.com/x") == \
        "see http://127.0.0.1:8000/w/1 and ssh://git@example.com/x"


_KEY = "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0"


def test_calls_the_browser_runs_reach_clients_redacted() -> None:
    """An agent may put a secret it has seen into a browser tool's arguments: spectators get those too."""
    from server.engine.public import public

    event = {"kind": "message", "seq": 7, "id": "msg_browser", "role": "assistant", "agent": "bob",
             "client_calls": ["c1"], "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "ui_notify", "arguments": json.dumps({"message": f"key {_KEY}"})}}]}
    shown = public(event)
    assert _KEY not in json.dumps(shown) and shown["redacted"] is True
    assert shown["client_calls"] == ["c1"] and shown["tool_calls"][0]["id"] == "c1"


def test_an_agent_config_event_reaches_clients_redacted() -> None:
    from server.engine.public import public

    model = "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo"  # looks random to the redactor: shown as it is
    config = {"name": "bob", "provider": "openai", "model": model, "base_url": "https://proxy:Hunter2Pass@llm.example/v1",
              "system_prompt": f"Search with key {_KEY}."}
    shown = public({"kind": "agent_added", "seq": 3, "agent": config, "sender": "owner"})["agent"]
    assert "Hunter2Pass" not in json.dumps(shown) and _KEY not in json.dumps(shown)
    assert (shown["name"], shown["model"]) == ("bob", model)


async def _streamed_in_pieces(text: str, size: int = 3) -> list[str]:
    from server.engine.turns.chunks import ChunkStream

    sent: list[str] = []

    async def publish(piece: str) -> None:
        sent.append(piece)
    stream = ChunkStream(publish, interval=0)
    for at in range(0, len(text), size):
        await stream.add(text[at:at + size])
    await stream.close()
    return sent


async def test_no_part_of_a_known_secret_is_streamed_whatever_characters_it_holds() -> None:
    password = f"Tr0ub&{secrets.token_hex(4)}!x"
    url = f"postgres://app:{password}@db.internal:5432/prod"
    remember_secret(url)  # an MCP server's env value, say
    sent = await _streamed_in_pieces(f"Sure: the URL is {url} as configured.")
    assert "".join(sent) == f"Sure: the URL is {REDACTED} as configured."
    assert not any(part in "".join(sent) for part in ("postgres", "Tr0ub", password[:8]))


async def test_no_part_of_a_urls_password_is_streamed_before_the_url_shows_it_is_one() -> None:
    sent = await _streamed_in_pieces("use https://proxyuser:p&ss!w0rd#9@llm.example.com/v1 then")
    assert "".join(sent) == f"use https://proxyuser:{REDACTED}@llm.example.com/v1 then"
    assert all("p&ss" not in piece and "w0rd" not in piece for piece in sent)


def test_a_label_ending_a_line_does_not_take_the_next_lines_label() -> None:
    assert redact_text("token:\npassword = hunter2hunter2") == f"token:\npassword = {REDACTED}"


async def test_text_after_a_bare_url_flows_whatever_its_script() -> None:
    sent = await _streamed_in_pieces("请访问https://example.com。" + "这是一个很长的句子" * 10, size=2)
    assert "这是一个很长的句子" in "".join(sent[:-1])  # before the stream ends


def test_an_approval_deadline_is_at_most_thirty_days_away_whatever_the_timeout_stored() -> None:
    from datetime import UTC, datetime, timedelta

    from server.engine.world.worlds import expires_at

    deadline = datetime.fromisoformat(expires_at(1e300).replace("Z", "+00:00"))
    assert deadline - datetime.now(UTC) <= timedelta(days=30)


def test_contains_redaction_sees_a_hidden_key_as_well_as_a_hidden_value() -> None:
    from server.redact import contains_redaction
    shown = redact({"headers": {"ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8": "x", "Accept": "json"}})
    assert "[redacted]" in shown["headers"]  # the key itself was hidden from the decider
    assert contains_redaction({"headers": {**shown["headers"], "Accept": "text"}})
    assert not contains_redaction({"headers": {"Accept": "text"}, "n": 1})
