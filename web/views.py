"""What the templates show, derived from events and live frames: plain dicts, one builder per thing."""
from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup
from pygments import highlight  # type: ignore[import-untyped]
from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
from pygments.lexers import get_lexer_for_filename  # type: ignore[import-untyped]
from pygments.util import ClassNotFound  # type: ignore[import-untyped]

from server import vocab
from server.hidden_text import describe, escape_hidden, hidden_characters, hidden_pieces, hidden_warning, piece_char
from server.redact import REDACTED, redact
from server.tools.globs import argument_text, describe_match, escape_glob

from .markdown import render_markdown

_LINE_FORMATTER = HtmlFormatter(nowrap=True)  # token spans only: app.css colours `.highlight` for both themes

FOLD_CHARS = 400  # longer tool arguments and results are folded into a <details>
# Characters of a tool's result a page shows: a 16 MiB MCP result is the log's to keep (export, `/events`),
# not every open page's to render and hold.
SHOWN_RESULT = 100_000
FOLD_LINES = 8
STATE_LABELS = {vocab.IDLE: "idle", vocab.THINKING: "thinking", "streaming": "streaming",
                vocab.WAITING_APPROVAL: "waiting for approval", vocab.RUNNING_TOOL: "running a tool",
                vocab.ERROR: "error", "waiting_client": "waiting for the page"}
OPTION_KEYS = {"deny": "d", "approve_once": "o", "approve_session": "s", "approve_for": "f", "approve_always": "a"}


def pretty(value: Any) -> str:
    """JSON for people: indented, non-ASCII kept."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _loads(text: object) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def folded(text: str) -> bool:
    return len(text) > FOLD_CHARS or text.count("\n") >= FOLD_LINES


def _arguments_text(raw: object) -> str:
    """A tool call's arguments, redacted and indented when they are JSON, as written otherwise."""
    parsed = _loads(raw)
    if isinstance(parsed, dict):
        return pretty(redact(parsed))
    return raw if isinstance(raw, str) else ""


def who(sender: object) -> str:
    """The name to show for an event's `sender`."""
    text = sender if isinstance(sender, str) else ""
    return vocab.member_of(text) or text or "someone"


def is_approval_request(event: vocab.Event) -> bool:
    calls: list[Any] = event.get("tool_calls") or []
    return (event.get("kind") == vocab.MESSAGE and event.get("role") == "assistant"
            and event.get("sender") == vocab.SERVER_SENDER and len(calls) == 1
            and calls[0].get("function", {}).get("name") == vocab.REQUEST_APPROVAL)


def _pieces(text: str) -> list[tuple[str, str | None, str]]:
    """`text` cut into (piece, mark, title): mark "redacted" where the server hid a value from this page,
    "hidden-char" for a character shown by its escape (server/hidden_text.py), None for text as it is."""
    out: list[tuple[str, str | None, str]] = []
    for i, part in enumerate(text.split(REDACTED)):
        if i:
            out.append((REDACTED, "redacted", "hidden by the server: a secret-looking value"))
        for piece, kind in hidden_pieces(part):
            out.append((piece, "hidden-char", f"{describe(piece_char(piece))}: {kind}, shown escaped") if kind
                       else (piece, None, ""))
    return out


def message_pieces(message: object) -> list[tuple[str, str | None, str]]:
    """A request's note (the LLM's, or an MCP server's question) as pieces: untrusted text, whose hidden
    characters are shown escaped as its arguments' are."""
    return _pieces(str(message or ""))


def _argument_view(name: str, value: Any) -> dict[str, Any]:
    """One argument as a decider reads it: strings exactly as written, anything else as JSON."""
    text = value if isinstance(value, str) else pretty(value)
    # `label`: the name as shown (an MCP tool may take any key: a disguised one is shown escaped too)
    return {"name": name, "label": _pieces(name), "pieces": _pieces(text), "redacted": REDACTED in text, "text": text,
            "json": not isinstance(value, str),
            "pattern": escape_glob(argument_text(value)), "multiline": "\n" in text or len(text) > 120}


def approval_view(event: vocab.Event, approved_by: list[str] | None = None,
                  may_decide: list[str] | None = None) -> dict[str, Any]:
    """One entry of the approval queue, from its `client.requestApproval` message (and, where several
    people must approve, who did so far; `may_decide`: who may still, as the engine lists it)."""
    call = event["tool_calls"][0]
    request = _loads(call["function"].get("arguments")) or {}
    asked_for = request.get("approvalsRequired")
    required = asked_for if isinstance(asked_for, int) else 1
    approved_by = approved_by or []
    arguments = request.get("toolArguments")
    hidden = hidden_characters(arguments)
    # A field cannot mark an escape apart from what it holds: a disguised call is not edited or made a
    # rule here (its text would be the disguise); it is approved once or for the chat, confirmed, or denied.
    options = [o for o in request.get("options") or () if o in OPTION_KEYS and not (hidden and o == "approve_always")]
    if "approve_session" in options:  # a time-boxed grant is a session grant with an end: offered beside it
        options.insert(options.index("approve_session") + 1, "approve_for")
    args = ([_argument_view(str(k), v) for k, v in arguments.items()] if isinstance(arguments, dict)
            else [_argument_view("arguments", arguments)] if arguments is not None else [])
    diff = diff_view(request.get("diff"), arguments.get("content") if isinstance(arguments, dict) else None)
    for arg in args:  # the diff shows what a write's content changes: its whole text is folded below it
        arg["folded"] = diff is not None and not diff["error"] and arg["name"] == "content"
    return {"id": call["id"], "seq": event.get("seq"), "agent": event.get("agent") or "", "chat": event.get("chat"),
            "asked": event.get("ts") or "", "tool": str(request.get("toolName") or "?"),
            "tool_call_id": request.get("toolCallId"),
            # The "always" form's patterns start as this exact call (glob characters escaped): broadening is an edit.
            "args": args, "patterns": args if isinstance(arguments, dict) else [],
            # The LLM's note beside the call is untrusted too: what it hides is shown as its arguments' is.
            "message": message_pieces(request.get("message")), "expires": request.get("expiresAt"),
            "options": options, "keys": OPTION_KEYS,
            # Edit & approve: the arguments a decider may change (a hidden value cannot be edited).
            "editable": [a for a in args if not a["redacted"]]  # (a network request is approved as asked)
            if isinstance(arguments, dict) and "approve_once" in options and required == 1 and not hidden
            and "network" not in request else [],
            "votes": votes_view(call["id"], required, approved_by) if required > 1 else None,
            # "needs 2 of owner, maria, joe": who may still decide (as asked, until the engine lists it anew).
            "who": who_decides(call["id"], max(required - len(approved_by), 1),
                               may_decide if may_decide is not None else request.get("mayDecide")),
            # Fewer people can approve it than it needs: everyone reads so at once, not the last one asked.
            "quorum_short": str(request.get("quorumShort") or "") if required > 1 else "",
            # Whom the call answers: who asked the agent for what it is doing (not a decider, under the rule).
            "asked_by": [who(name) for name in request.get("askers") or () if isinstance(name, str)],
            # What approving it once must confirm, as a wide scope does (static/app.js).
            "hidden": hidden, "warning": hidden_warning(hidden),
            "diff": diff, "network": network_view(request)}


def network_view(request: dict[str, Any]) -> dict[str, Any] | None:
    """A network request's connection (the `ask` mode): which command wants to reach which host:port.
    The proxy asks only for ASCII names and IP addresses (server/tools/egress/hosts.py), so an
    internationalized name arrives as its punycode (`xn--`), and is said to be one; the pieces still
    show anything hidden escaped."""
    network, arguments = request.get("network"), request.get("toolArguments")
    if not isinstance(network, dict) or not isinstance(arguments, dict):
        return None
    target = str(arguments.get("host") or "")
    pieces = _pieces(target)
    # `shown`: as the confirmations quote it (static/app.js), escapes and all
    return {"target": target, "pieces": pieces, "shown": "".join(p[0] for p in pieces),
            "tool": str(network.get("tool") or "?"),
            "punycode": any(label.startswith("xn--") for label in target.rpartition(":")[0].split("."))}


def diff_view(diff: object, content: object = None) -> dict[str, Any] | None:
    """A file write's diff against the current file (the request's `diff`, server/tools/builtin.py):
    each line with its tone, and its text cut into pieces as arguments are; a new file is its `content`
    as it will be written. Both are highlighted by the file's language unless a line holds a redacted
    value or a hidden character (those keep their marks, and are shown as written)."""
    if not isinstance(diff, dict):
        return None
    path = str(diff.get("path") or "")
    lexer = _lexer_for(path)
    new = bool(diff.get("new"))
    lines = []
    if new and isinstance(content, str) and not diff.get("error"):
        for line in content.splitlines():  # a new file: its content, not a column of "+"
            lines.append({"tone": "same", "sign": "", "pieces": _pieces(line), "html": _highlighted(line, lexer)})
    else:
        for i, line in enumerate(str(diff.get("text") or "").splitlines()):
            head = (i < 2 and line.startswith(("---", "+++"))) or line.startswith("@@")  # not a removed `-- x`
            tone = ("head" if head else "add" if line.startswith("+")
                    else "del" if line.startswith("-") else "same")
            code = line if head else line[1:]
            lines.append({"tone": tone, "sign": "" if head else line[:1], "pieces": _pieces(code),
                          "html": None if head else _highlighted(code, lexer)})
    return {"path": path, "new": new, "lines": lines,
            "error": diff.get("error") if isinstance(diff.get("error"), str) else None}


def _lexer_for(path: str) -> Any:
    """Pygments' lexer for a file's name, or None (plain text, or a name it does not know)."""
    try:
        lexer = get_lexer_for_filename(path.rsplit("/", 1)[-1], stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None
    return None if lexer.name == "Text only" else lexer


def _highlighted(line: str, lexer: Any) -> Markup | None:
    """One line highlighted (Pygments escapes it), or None where it must keep its marks (`_pieces`)."""
    if lexer is None or not line or REDACTED in line or hidden_characters(line):
        return None
    return Markup(highlight(line, lexer, _LINE_FORMATTER).rstrip("\n"))


def votes_view(approval_id: object, required: int, approved_by: list[str]) -> dict[str, Any]:
    """Who approved a request that needs several people, so far: "1 of 2 approvals: maria"."""
    return {"id": approval_id, "required": required, "names": [who(v) for v in approved_by]}


def who_decides(approval_id: object, needs: int, names: object) -> dict[str, Any] | None:
    """Who may still decide a request: "needs 2 of owner, maria, joe" (None for a request asked before
    requests said so)."""
    if not isinstance(names, list):
        return None
    shown = ", ".join(str(n) for n in names)
    text = f"needs {needs} of {shown}" if names else f"needs {needs}: nobody left may approve it, it can only be denied"
    return {"id": approval_id, "text": text}


def vote_view(event: vocab.Event) -> dict[str, Any]:
    """The progress a partial approval (one vote of several) makes visible on every screen."""
    decision = event.get("decision") or {}
    return votes_view(event.get("tool_call_id"), int(decision.get("required") or 2), list(decision.get("voters") or []))


def decided_view(event: vocab.Event) -> dict[str, Any]:
    """A decision as the open queue tells it: who decided, what, when (its request leaves the queue)."""
    decision = event.get("decision") or {}
    if decision.get("timeout"):
        by, verb = "", "timed out"
    elif decision.get("policy"):  # a rule or grant decided it: the text names which
        by, verb = "", "decided"
    else:
        by = who(event.get("sender"))
        verb = "approved" if decision.get("decision") == vocab.APPROVE else "denied"
    return {"id": event.get("tool_call_id"), "by": by, "verb": verb, "ts": event.get("ts") or "",
            "text": _decision_text(event)}


def _decision_text(event: vocab.Event) -> str:
    decision = event.get("decision") or {}
    tool = decision.get("tool") or "the tool"
    policy = decision.get("policy")
    if isinstance(policy, dict):  # a rule or grant added while the request was pending decided it
        return f"{tool}: {policy.get('reason')}."
    if decision.get("timeout"):
        return f"The request to run {tool} timed out."
    if decision.get("decision") == vocab.APPROVE:
        scope = {"once": "once", "session": "for this chat", "always": "always"}.get(str(decision.get("scope")), "")
        match = decision.get("match")
        extra = f" when {describe_match(match, 'matches')}" if match else ""
        return f"{who(event.get('sender'))} approved {tool} {scope}{extra}."
    reason = decision.get("reason")
    return f"{who(event.get('sender'))} denied {tool}" + (f": {reason}" if reason else ".")


BRIEF_CHARS = 80


def _brief(raw: object) -> str:
    """What a step's header quotes of its arguments: the command or the path, on one line."""
    parsed = _loads(raw)
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
        text = _arguments_text(function.get("arguments"))
        out.append({"id": call.get("id"), "name": function.get("name") or "?", "arguments": text,
                    "pieces": _pieces(text), "warning": hidden_warning(hidden_characters(_loads(text) or text)),
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
    parsed = _loads(content) if not isinstance(content, str) or len(content) <= SHOWN_RESULT else None
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
        decision = {"text": _decision_text(event),
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


def conversation_item(event: vocab.Event) -> dict[str, Any] | None:
    """How a persisted event shows in its chat's conversation, or None when it does not."""
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
        return {**base, "type": "agent", "html": render_markdown(content) if isinstance(content, str) else None,
                "calls": _call_views(event), "to_agents": event.get("sender") != event.get("agent"),
                # the agents it speaks to ("alice → bob"); a reply to people names none
                "to": [str(t) for t in to] if isinstance(to := event.get("to"), list) else [],
                "stopped": event.get("stopped"), "version": event.get("version"),
                "version_of": event.get("version_of")}
    return None


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


def status_view(frame: dict[str, Any], streaming: bool = False) -> dict[str, Any]:
    """An agent's live status from a `status` frame (or the board's current one)."""
    state = frame.get("state") or vocab.IDLE
    if state == vocab.WAITING_APPROVAL and frame.get("waiting_for") == "client":
        state = "waiting_client"
    if state == vocab.IDLE and frame.get("last_error"):
        state = vocab.ERROR
    if streaming:
        state = "streaming"
    detail = frame.get("last_error") if state == vocab.ERROR else None
    if frame.get("retry"):
        detail = f"retry {frame['retry']}: {frame.get('last_error') or ''}"
    return {"agent": frame.get("agent") or "", "state": state, "label": STATE_LABELS.get(state, str(state)),
            "detail": detail, "chat": frame.get("chat") if isinstance(frame.get("chat"), str) else None}


def agent_view(agent: dict[str, Any]) -> dict[str, Any]:
    return {"name": agent.get("name") or "", "provider": agent.get("provider") or "", "model": agent.get("model") or "",
            "system_prompt": agent.get("system_prompt") or "", "base_url": agent.get("base_url") or "",
            "tools": ", ".join(agent["tools"]) if isinstance(agent.get("tools"), list) else "",
            "tools_mode": "list" if isinstance(agent.get("tools"), list) else "all"}


def rule_view(rule: dict[str, Any]) -> dict[str, Any]:
    match = rule.get("match") or {}
    return {"id": rule.get("id"), "tool": rule.get("tool"), "effect": rule.get("effect"),
            "match": describe_match(match, allow=rule.get("effect") == "allow"), "by": who(rule.get("by"))}


def grant_view(grant: dict[str, Any]) -> dict[str, Any]:
    return {"id": grant.get("id"), "tool": grant.get("tool"), "effect": grant.get("effect"),
            "chat": grant.get("chat"), "agent": grant.get("agent") or "nobody (an old grant)",
            "by": who(grant.get("by")), "expires": grant.get("expires_at"),
            "left": time_left(grant.get("expires_at"))}


def time_left(end: object, now: datetime | None = None) -> str:
    """"29 min left" until a time-boxed grant's end (static/app.js counts it down on the page)."""
    if not isinstance(end, str):
        return ""
    try:
        seconds = (datetime.fromisoformat(end.replace("Z", "+00:00")) - (now or datetime.now(UTC))).total_seconds()
    except ValueError:
        return ""
    if seconds <= 0:
        return "ended"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min left" if minutes < 120 else f"{math.ceil(minutes / 60)} h left"


def client_call_view(call_id: str, name: str, arguments: Any, agent: str | None) -> dict[str, Any]:
    return {"id": call_id, "name": name, "agent": agent or "",
            "arguments": json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)}


def client_calls_of(event: vocab.Event) -> list[dict[str, Any]]:
    """The calls of an assistant message that a browser must run (`client_calls`)."""
    client = set(event.get("client_calls") or ())
    out = []
    for call in event.get("tool_calls") or ():
        if call.get("id") in client:
            function = call.get("function") or {}
            arguments = _loads(function.get("arguments"))
            out.append(client_call_view(call["id"], function.get("name") or "", arguments, event.get("agent")))
    return out


def mcp_state_view(status: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """An MCP server's state line: a status of `GET /api/worlds/{w}` (`name` given) or an `mcp_state` frame."""
    reason = status.get("reason") or (status.get("last_error") or {}).get("message")
    return {"name": name or status.get("server") or "", "state": status.get("state") or "stopped", "reason": reason}
