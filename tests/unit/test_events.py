"""Typed events (issue 29): each kind has one shape and one constructor in server/events/, and nothing
else builds an event from a dict literal."""
from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from server import events, vocab

ROOT = Path(__file__).resolve().parents[2]
KINDS = {str(kind) for kind in vocab.EventKind}


def _shapes() -> dict[str, type]:
    """The TypedDicts of server/events/, by each kind their `kind` literal allows."""
    found: dict[str, type] = {}
    for value in vars(events).values():
        if isinstance(value, type) and typing.is_typeddict(value):
            kind = typing.get_type_hints(value).get("kind")
            for name in typing.get_args(kind):
                found[name] = value
    return found


def test_every_event_kind_has_its_shape() -> None:
    assert set(_shapes()) == KINDS


def _event_literals(path: Path) -> list[str]:
    """Where `path` writes a dict literal whose "kind" is an event kind (`vocab.X` or the kind's text)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and key.value == "kind"):
                continue
            named = value.attr if isinstance(value, ast.Attribute) else None
            text = value.value if isinstance(value, ast.Constant) else None
            if (named and str(getattr(vocab, named, "")) in KINDS) or text in KINDS:
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}")
    return found


def test_nothing_but_the_constructors_builds_an_event_from_a_dict_literal() -> None:
    paths = [p for package in ("server", "web") for p in (ROOT / package).rglob("*.py")
             if not p.is_relative_to(ROOT / "server" / "events")]
    assert [where for path in paths for where in _event_literals(path)] == []


def test_the_literal_finder_finds_one(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('EVENT = {"kind": vocab.NOTICE, "text": "hi"}\nVIEW = {"kind": "text"}\n')
    assert _event_literals(sample) == ["sample.py:1"]


@pytest.mark.parametrize("made", [
    events.notice("main", "alice", "reached the limit", input_seq=4),
    events.agent_error("main", "alice", "could not answer", input_seq=4),
    events.human_message("main", "human:max", "invite:1", "hello", ["alice"]),
    events.tool_started("call_1", "shell_exec", "alice", "main", False, {"verdict": "allow"}),
])
def test_a_constructor_makes_its_kind(made: vocab.Event) -> None:
    assert made["kind"] in KINDS and isinstance(made, dict)


def test_request_id_is_the_id_of_a_requests_one_call() -> None:
    request = events.approval_request("main", "alice", "approval_call_1", {"toolCallId": "call_1"})
    assert events.request_id(request) == "approval_call_1"
