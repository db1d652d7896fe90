"""The conversation: messages, and each tool call as one folded step (call, approval, decision, result)."""
from __future__ import annotations

import json
from typing import Any

from server import vocab
from server.hidden_text import escape_hidden, hidden_characters, hidden_warning
from server.redact import redact

from ..markdown import Rendered, render_markdown, render_streamed
from .approvals import approval_view, decision_text
from .text import (
    FOLD_CHARS,
    SHOWN_RESULT,
    arguments_text,
    folded,
    is_approval_request,
    json_value,
    pretty,
    text_pieces,
    who,
)

BRIEF_CHARS = 80


def _brief(raw: object) -> str:
    """What a step's header quotes of its arguments: the command or the path, on one line."""
    parsed = json_value(raw)
    if not isinstance(parsed, dict):
        return ""
    shown = redact(parsed)
    for key in ("command", "path", "url", "query"):
        value = shown.get(key)
        if isinstance(value, str) and value.strip():
            line = value.strip().splitlines()[0]
            more = len(line) > BRIEF_CHARS or "\n" in value.strip()
            return escape_hidden(line[:BRIEF_CHARS]) + ("…" if more else "")
    return ""


def _call_views(event: vocab.Event) -> list[dict[str, Any]]:
    """Each tool call of an assistant message as a step; later events fill in `how`, `decision` and `result`."""
    client = set(event.get("client_calls") or ())
    out = []
    for call in event.get("tool_calls") or ():
        function = call.get("function") or {}
        text = arguments_text(function.get("arguments"))
        out.append({"id": call.get("id"), "name": function.get("name") or "?", "arguments": text,
                    "pieces": text_pieces(text), "warning": hidden_warning(hidden_characters(json_value(text) or text)),
                    "agent": event.get("agent") or "", "brief": _brief(function.get("arguments")),
                    "client": call.get("id") in client, "how": None, "decision": None, "result": None})
    return out


def _written_file(event: vocab.Event, parsed: Any) -> dict[str, str] | None:
    """The file a `file_write` result wrote (its step links to it in the files panel), or None."""
    if event.get("name") != "file_write" or _not_run(event) or not isinstance(parsed, dict):
        return None
    path, world = parsed.get("path"), event.get("world")
    if not (isinstance(path, str) and path and isinstance(world, str)) or "error" in parsed:
        return None
    return {"path": path, "world": world}


def _result_view(event: vocab.Event) -> dict[str, Any]:
    """A tool's result by kind: shell output as a terminal, JSON pretty-printed, text as written; its start
    only, past SHOWN_RESULT characters (not parsed then: its start is shown as text)."""
    content = event.get("content")
    parsed = json_value(content) if not isinstance(content, str) or len(content) <= SHOWN_RESULT else None
    name = event.get("name") or "tool"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    view: dict[str, Any] = {"name": name, "call_id": event.get("tool_call_id"), "ts": event.get("ts") or "",
                            "by_page": vocab.member_of(event.get("sender")), "kind": "text", "exit_code": None,
                            "truncated": False, "timed_out": False,
                            "error": error if isinstance(error, str) else None,
                            "denied": _not_run(event)}
    if view["error"] is not None:
        view.update(kind="error", text=view["error"])
    elif isinstance(parsed, dict) and isinstance(parsed.get("output"), str) and "exit_code" in parsed:
        view.update(kind="shell", text=parsed["output"], exit_code=parsed.get("exit_code"),
                    truncated=bool(parsed.get("truncated")), timed_out=bool(parsed.get("timed_out")))
    elif isinstance(parsed, dict) and parsed and all(_scalar(v) for v in parsed.values()):
        # A result's fields (file_write's path and bytes, say) read as a result, not as JSON to decipher.
        fields = [(str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in parsed.items()]
        view.update(kind="fields", text="\n".join(f"{k}: {v}" for k, v in fields), fields=fields)
    elif isinstance(parsed, (dict, list)):
        view.update(kind="json", text=pretty(parsed))
    else:
        text = content if isinstance(content, str) else pretty(content)
        view.update(kind="file" if name == "file_read" else "text", text=text,
                    truncated=name == "file_read" and "\n[... truncated: showing " in text)
    view["shown_of"] = len(view["text"]) if len(view["text"]) > SHOWN_RESULT else None
    if view["shown_of"] is not None:
        view["text"] = view["text"][:SHOWN_RESULT]
    view["fold"] = folded(view["text"])
    view["file"] = _written_file(event, parsed)
    return view


def _scalar(value: object) -> bool:
    """A value a result's field shows on one line: a number, a flag, a short line of text."""
    if isinstance(value, str):
        return len(value) <= FOLD_CHARS and "\n" not in value
    return value is None or isinstance(value, (int, float, bool))


def _not_run(event: vocab.Event) -> bool:
    """Whether a result answers a call that never ran: denied by a person, a rule or a grant, or timed out."""
    return event.get("not_run") in (vocab.DENIED, vocab.TIMED_OUT)


def _how_of_decision(event: vocab.Event) -> dict[str, Any]:
    decision = event.get("decision") or {}
    policy = decision.get("policy")
    approved = decision.get("decision") == vocab.APPROVE
    if decision.get("timeout"):
        text = "timed out"
    elif isinstance(policy, dict):
        text = str(policy.get("reason") or "decided by a rule")
    else:
        scope = {"session": " for this chat", "always": " always"}.get(str(decision.get("scope")), "")
        text = f"{'approved' if approved else 'denied'}{scope} by {who(event.get('sender'))}"
    return {"text": text, "tone": "ok" if approved else "no", "started": event.get("ts") if approved else None,
            "approval": None}


def step_part(event: vocab.Event) -> dict[str, Any] | None:
    """What an event adds to a tool call's step (its call id and the parts it fills in), or None."""
    kind = event.get("kind")
    if kind == vocab.TOOL_STARTED and isinstance(event.get("policy"), dict):
        # Every run is on the record: one that nobody was asked about says what allowed it.
        how = {"text": str(event["policy"].get("reason") or "allowed"), "tone": "ok", "started": event.get("ts"),
               "approval": None}
        return {"call_id": event.get("call_id"), "how": how}
    if kind != vocab.MESSAGE:
        return None
    if is_approval_request(event):
        approval = approval_view(event)
        how = {"text": "waiting for approval", "tone": "wait", "started": None, "approval": approval["id"]}
        return {"call_id": approval["tool_call_id"], "how": how, "agent": approval["agent"], "name": approval["tool"],
                "decision": {"pending": approval["id"]}}
    if event.get("role") != "tool":
        return None
    if event.get("decision"):
        call_id = vocab.call_id_of_approval(str(event.get("tool_call_id") or ""))
        decision = {"text": decision_text(event),
                    "approved": (event.get("decision") or {}).get("decision") == vocab.APPROVE}
        part: dict[str, Any] = {"call_id": call_id, "how": _how_of_decision(event), "decision": decision}
        edit = _edit_view(event)
        if edit:  # the step's head says what runs now: the edited call, and what was asked
            part |= {"head": True, "agent": event.get("agent") or "", "name": edit["tool"], "brief": edit["ran"],
                     "edit": edit}
        return part
    result = _result_view(event)
    policy = event.get("policy")
    if result["denied"] and isinstance(policy, dict):  # a deny rule refused it: the head names the rule
        how = {"text": str(policy.get("reason") or "denied"), "tone": "no", "started": None, "approval": None}
        return {"call_id": event.get("tool_call_id"), "how": how, "result": result}
    return {"call_id": event.get("tool_call_id"), "result": result}


def _edit_view(event: vocab.Event) -> dict[str, Any] | None:
    """An approval that changed the call (edit & approve): who edited it, what runs and what was asked."""
    decision = event.get("decision") or {}
    ran, asked, changed = decision.get("arguments"), decision.get("original"), decision.get("changed")
    if not (changed and isinstance(ran, dict) and isinstance(asked, dict)):
        return None
    now, was = _brief(json.dumps(ran)), _brief(json.dumps(asked))
    return {"by": who(event.get("sender")), "tool": str(decision.get("tool") or "?"), "ran": now,
            "was": was if was != now else "", "changed": ", ".join(str(k) for k in changed)}


def conversation_item(event: vocab.Event, streamed: Rendered = ()) -> dict[str, Any] | None:
    """How a persisted event shows in its chat's conversation, or None when it does not (`streamed`: the
    blocks a reply's stream rendered, web/streaming.py)."""
    kind = event.get("kind")
    base = {"dom_id": f"m-{event.get('id') or event.get('seq')}", "seq": event.get("seq"), "chat": event.get("chat"),
            "ts": event.get("ts") or "", "agent": event.get("agent"), "sender": who(event.get("sender"))}
    if kind == vocab.NOTICE:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "notice", "text": str(event.get("text") or "")}
    if kind == vocab.AGENT_ERROR:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "error", "text": str(event.get("message") or "")}
    if kind == vocab.TURN_RETRIED:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "notice",
                "text": f"{base['sender']} asked {event.get('agent')} to answer again"}
    if kind == vocab.MESSAGE_EDITED:  # the person's new version, below the original (which stays as it was)
        return {**base, "dom_id": f"e-{event['seq']}", "type": "human", "edit_of": event.get("edit_of"),
                "html": render_markdown(str(event.get("content") or "")), "to": list(event.get("to") or [])}
    if kind == vocab.REPLY_REGENERATED:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "notice",
                "text": f"{base['sender']} asked {event.get('agent')} for version {event.get('version')} of its reply"}
    if kind == vocab.FILE_UPLOADED:
        return {**base, "dom_id": f"e-{event['seq']}", "type": "upload", "path": str(event.get("path") or ""),
                "size": event.get("size"), "world": event.get("world")}
    part = step_part(event)
    if part is not None:  # approvals, decisions, runs and results belong to their call's step
        return {**base, "type": "step", "part": part}
    if kind != vocab.MESSAGE:
        return None
    role = event.get("role")
    if role == "user":
        to = event.get("to")  # who it went to (None in events from before it was recorded)
        return {**base, "type": "human", "html": render_markdown(str(event.get("content") or "")),
                "text": str(event.get("content") or ""),
                "to": [str(t) for t in to] if isinstance(to, list) else None}
    if role == "assistant":
        content = event.get("content")
        made = render_streamed(content, streamed) if isinstance(content, str) else None
        # what follows the blocks a page that watched the stream keeps (web/render.py, `kept_view`)
        return {**base, "type": "agent", "html": made and made.html, "after_blocks": made and made.after_blocks,
                "message_id": event.get("id"),
                "calls": _call_views(event), "to_agents": event.get("sender") != event.get("agent"),
                # the agents it speaks to ("alice → bob"); a reply to people names none
                "to": [str(t) for t in to] if isinstance(to := event.get("to"), list) else [],
                "stopped": event.get("stopped"), "version": event.get("version"),
                "version_of": event.get("version_of")}
    return None


def conversation_items(events: list[vocab.Event]) -> list[dict[str, Any]]:
    """A chat's events as its conversation's items (`conversation`; a pure function, for a worker process)."""
    return conversation([item for event in events if (item := conversation_item(event))])


def conversation(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat's items for the first page: each step part folded into its call's step (as the live page
    swaps it in), the articles in order. A part whose call is not shown (older history) is dropped."""
    steps: dict[str, dict[str, Any]] = {}
    out = []
    for item in items:
        if item["type"] == "step":
            step = steps.get(item["part"].get("call_id"))
            if step is not None:
                step.update({k: v for k, v in item["part"].items() if k != "call_id"})
            continue
        for call in item.get("calls") or ():
            steps[call["id"]] = call
        out.append(item)
    return out
