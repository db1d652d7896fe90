"""A request in the approval queue as the page shows it: its call, arguments, diff or connection, votes and
who may still decide, and decisions once made."""
from __future__ import annotations

from typing import Any

from markupsafe import Markup
from pygments import highlight  # type: ignore[import-untyped]
from pygments.lexers import get_lexer_for_filename  # type: ignore[import-untyped]
from pygments.util import ClassNotFound  # type: ignore[import-untyped]

from server import vocab
from server.hidden_text import hidden_characters, hidden_warning
from server.redact import REDACTED
from server.tools.globs import argument_text, describe_match, escape_glob

from .text import LINE_FORMATTER, OPTION_KEYS, json_value, message_pieces, pretty, text_pieces, who


def _argument_view(name: str, value: Any) -> dict[str, Any]:
    """One argument as a decider reads it: strings exactly as written, anything else as JSON."""
    text = value if isinstance(value, str) else pretty(value)
    # `label`: the name as shown (an MCP tool may take any key: a disguised one is shown escaped too)
    return {"name": name, "label": text_pieces(name), "pieces": text_pieces(text), "redacted": REDACTED in text,
            "text": text, "json": not isinstance(value, str),
            "pattern": escape_glob(argument_text(value)), "multiline": "\n" in text or len(text) > 120}


def approval_view(event: vocab.Event, approved_by: list[str] | None = None,
                  may_decide: list[str] | None = None) -> dict[str, Any]:
    """One entry of the approval queue, from its `client.requestApproval` message (and, where several
    people must approve, who did so far; `may_decide`: who may still, as the engine lists it)."""
    call = event["tool_calls"][0]
    request = json_value(call["function"].get("arguments")) or {}
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
    pieces = text_pieces(target)
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
            lines.append({"tone": "same", "sign": "", "pieces": text_pieces(line), "html": _highlighted(line, lexer)})
    else:
        for i, line in enumerate(str(diff.get("text") or "").splitlines()):
            head = (i < 2 and line.startswith(("---", "+++"))) or line.startswith("@@")  # not a removed `-- x`
            tone = ("head" if head else "add" if line.startswith("+")
                    else "del" if line.startswith("-") else "same")
            code = line if head else line[1:]
            lines.append({"tone": tone, "sign": "" if head else line[:1], "pieces": text_pieces(code),
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
    """One line highlighted (Pygments escapes it), or None where it must keep its marks (`text_pieces`)."""
    if lexer is None or not line or REDACTED in line or hidden_characters(line):
        return None
    return Markup(highlight(line, lexer, LINE_FORMATTER).rstrip("\n"))


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
            "text": decision_text(event)}


def decision_text(event: vocab.Event) -> str:
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
