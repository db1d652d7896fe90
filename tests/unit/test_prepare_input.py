"""The one function that prepares LLM input from an agent's memory."""
from __future__ import annotations

from typing import Any

from server.engine.turns.llm_input import prepare_input
from server.engine.turns.routing import addressees, mentions


def _m(seq: int, **fields: object) -> dict[str, Any]:
    return {"kind": "message", "seq": seq, "id": f"msg_{seq}", "ts": "t", "world": "w", "chat": "c", **fields}


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_client_calls_and_their_answers_never_reach_the_llm() -> None:
    memory = [
        _m(1, agent=None, sender="human:max", role="user", content="go"),
        _m(2, agent="alice", sender="alice", role="assistant", content=None,
           tool_calls=[_call("call_1", "shell_exec")]),
        _m(3, agent="alice", sender="server", role="assistant", content=None,
           tool_calls=[_call("approval_1", "client.requestApproval")]),
        _m(4, agent="alice", sender="human:max", role="tool", tool_call_id="approval_1",
           content='{"decision":"approve"}'),
        _m(5, agent="alice", sender="server", role="tool", tool_call_id="call_1", content="out"),
    ]
    assert prepare_input(agent="alice", system_prompt="be brief", memory=memory) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "name": "max", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "shell_exec")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "out"},
    ]


def test_tool_results_follow_their_call_even_when_a_human_spoke_in_between() -> None:
    memory = [
        _m(1, agent=None, sender="human:max", role="user", content="go"),
        _m(2, agent="alice", sender="alice", role="assistant", content="on it",
           tool_calls=[_call("call_1", "a"), _call("call_2", "b")]),
        _m(3, agent="alice", sender="server", role="tool", tool_call_id="call_2", content="two"),
        _m(4, agent=None, sender="human:eve", role="user", content="also this"),
        _m(5, agent="alice", sender="server", role="tool", tool_call_id="call_1", content="one"),
    ]
    roles = [(m["role"], m.get("tool_call_id") or m.get("content")) for m in
             prepare_input(agent="alice", system_prompt="", memory=memory)]
    assert roles == [("user", "go"), ("assistant", "on it"), ("tool", "call_2"), ("tool", "call_1"),
                     ("user", "also this")]


def test_other_agents_speak_as_named_users_and_metadata_is_stripped() -> None:
    memory = [_m(1, agent="bob", sender="bob", role="assistant", content="@alice look", usage={"x": 1})]
    assert prepare_input(agent="alice", system_prompt="", memory=memory) == [
        {"role": "user", "name": "bob", "content": "@alice look"}]


def test_the_window_starts_at_a_user_message() -> None:
    memory = [_m(1, agent=None, sender="human:max", role="user", content="q1"),
              _m(2, agent="alice", sender="alice", role="assistant", content=None, tool_calls=[_call("call_1", "a")]),
              _m(3, agent="alice", sender="server", role="tool", tool_call_id="call_1", content="r"),
              _m(4, agent="alice", sender="alice", role="assistant", content="a1"),
              _m(5, agent=None, sender="human:max", role="user", content="q2"),
              _m(6, agent="alice", sender="alice", role="assistant", content="a2")]
    window = prepare_input(agent="alice", system_prompt="s", memory=memory, max_messages=3)
    assert [m.get("content") for m in window] == ["s", "q2", "a2"]


def test_mentions_count_only_at_the_start_of_a_paragraph() -> None:
    assert mentions("@bob do this\n\nand @carol not this\n@dave yes") == ["bob", "dave"]
    assert mentions("@alice @bob look\n  @carol,@dave too") == ["alice", "bob", "carol", "dave"]
    assert mentions("mail me@example.org") == []
    assert addressees("hello", ["a", "b"], sender_agent=None) == ["a", "b"]
    assert addressees("@b hi", ["a", "b"], sender_agent=None) == ["b"]
    assert addressees("@a @b", ["a", "b"], sender_agent="a") == ["b"]  # never back to itself
    assert addressees("@a @b", ["a", "b"], sender_agent=None) == ["a", "b"]
    assert addressees("@b, @a: both of you", ["a", "b"], sender_agent=None) == ["b", "a"]
    assert addressees("@a then ask @b", ["a", "b"], sender_agent=None) == ["a"]  # only the leading run
    assert addressees("@a", ["a", "b"], sender_agent="a") == []
    assert addressees("no mention", ["a", "b"], sender_agent="a") == []


def test_a_retried_stopped_reply_is_left_out_and_a_retried_error_changes_nothing() -> None:
    memory = [_m(1, agent=None, sender="human:max", role="user", content="go"),
              _m(2, agent="alice", sender="alice", role="assistant", content=None, tool_calls=[_call("call_1", "a")]),
              {**_m(3, agent="alice", sender="server", role="tool", tool_call_id="call_1", content="r"), "id": None},
              _m(4, agent="alice", sender="alice", role="assistant", content="half *(stopped by max)*",
                 stopped="stopped by max")]
    before = prepare_input(agent="alice", system_prompt="", memory=memory)
    error_retried = {"kind": "turn_retried", "seq": 5, "agent": "alice", "retry_of": 3, "retry_of_id": None}
    assert prepare_input(agent="alice", system_prompt="", memory=[*memory, error_retried]) == before
    stop_retried = {"kind": "turn_retried", "seq": 5, "agent": "alice", "retry_of": 4, "retry_of_id": "msg_4"}
    assert prepare_input(agent="alice", system_prompt="", memory=[*memory, stop_retried]) == before[:-1]
