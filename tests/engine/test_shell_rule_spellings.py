"""Deny and ask rules cover a command however it is spelled (paths, wrappers, tabs, quotes, commands
that run other commands), and an allow rule's wildcard never covers a comment: through the policy with
a session grant in force, and through the engine."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server import vocab
from server.engine.approvals.policy import evaluate
from server.errors import AppError
from server.testing.openai_double import Text
from server.tools.builtin import shell_tool
from server.tools.globs import glob_matches
from tests.fixtures.engine import MEMBER, OWNER, Harness, run_on_request, tool_calls

_WRAPPERS = ["command", "builtin", "exec", "env", "env -i", "env A=1 B=2", "env -u HOME", "nice", "nice -n 5",
             "nice -5", "nohup", "timeout 5", "timeout -s KILL 5", "timeout --kill-after=1 5", "stdbuf -oL",
             "stdbuf -o L", "time", "time -p", "setsid", "sudo", "sudo -u root", "sudo -E --user=root", "doas",
             "doas -u root", "busybox", "ionice -c 3", "chrt -o 0", "taskset 1", "taskset -c 0", "sudo A=1"]
_PATHS = ["{}", "/bin/{}", "/usr/bin/{}", "./{}", "/usr/local/sbin/{}"]
_BLANKS = [" ", "\t", "  ", " \t "]
_ARGS = {"rm": ["-rf x", "-r -f x", "-rf 'x'", '-rf "x"', "-rf -- x"], "chmod": ["777 x", "-R 777 x", "777 'x'"]}
_BEFORE = ["", "A=1 ", "A=$(id) B=2 ", "true; ", "echo hi && ", "false || ", "(", "{ ", "! ", "if true; then "]
# What the matcher cannot see into: each runs `rm -rf x` or `chmod 777 x` in a way no word shows.
_UNSEEN = {
    "rm": ["find . -name x -delete", "find . -name x -exec rm -rf {} +", "echo x | xargs rm -rf",
           "sh -c 'rm -rf x'", "bash -c \"rm -rf x\"", "dash -c 'rm -rf x'", "busybox sh -c 'rm -rf x'",
           "eval 'rm -rf x'", "eval rm -rf x", "python3 -c 'import shutil; shutil.rmtree(\"x\")'",
           "python -c 'import os; os.system(\"rm -rf x\")'", "perl -e 'system(\"rm -rf x\")'",
           "ruby -e 'system(\"rm -rf x\")'", "node -e 'require(\"fs\").rmSync(\"x\",{recursive:true})'",
           "awk 'BEGIN{system(\"rm -rf x\")}'", "echo 'rm -rf x' | sh", "sh <<EOF\nrm -rf x\nEOF",
           "'rm' -rf x", "\"rm\" -rf x", "r\\m -rf x", "\\rm -rf x", "$(echo rm) -rf x", "`echo rm` -rf x",
           "R=rm; $R -rf x", "${R:-rm} -rf x", "/bin/r? -rf x", "{rm,-rf,x}", "env -S 'rm -rf x'",
           "sudo -s rm -rf x", ". ./script-that-deletes", "source ./script-that-deletes",
           # found by review: wrappers not read option by option, and programs that run what they are given
           "env - rm -rf x", "setpriv rm -rf x", "prlimit rm -rf x", "setarch x86_64 rm -rf x",
           "logsave /dev/null rm -rf x", "ssh-agent rm -rf x", "choom -n 0 -- rm -rf x",
           "git -c alias.x=!rm x -rf x", "echo '!rm -rf x' | ed", "alias r=rm\nr -rf x",
           "echo x | sed 's/.*/rm -rf x/e'", "echo x | sed 'e rm -rf x'"],
    "chmod": ["find . -name x -exec chmod 777 {} \\;", "echo x | xargs chmod 777", "sh -c 'chmod 777 x'",
              "python3 -c 'import os; os.chmod(\"x\", 0o777)'", "perl -e 'chmod 0777, \"x\"'",
              "'chmod' 777 x", "c\\hmod 777 x", "$(printf chmod) 777 x"],
}


@st.composite
def _spelling(draw: st.DrawFn, program: str) -> str:
    """`rm -rf x` or `chmod 777 x`, spelled some way a shell runs the same."""
    if draw(st.booleans()):
        return draw(st.sampled_from(_UNSEEN[program]))
    blank = draw(st.sampled_from(_BLANKS))
    words = [*draw(st.lists(st.sampled_from(_WRAPPERS), max_size=3)),
             draw(st.sampled_from(_PATHS)).format(program), draw(st.sampled_from(_ARGS[program]))]
    return draw(st.sampled_from(_BEFORE)) + blank.join(words) + draw(st.sampled_from(["", " 2>/dev/null", " &"]))


def _rule(effect: str, pattern: str, required: int = 1) -> dict[str, Any]:
    rule = {"id": f"rule_{effect}_{pattern.split()[0]}", "tool": "shell_exec", "match": {"command": pattern},
            "effect": effect, "by": "olivia"}
    return {"rule": rule | ({"approvals_required": required} if effect == "ask" else {})}


_GRANT = {"grant": {"id": "grant_1", "chat": "main", "agent": "alice", "tool": "shell_exec", "effect": "allow",
                    "by": "olivia"}}


def _verdict(command: str, rules: list[dict[str, Any]]) -> Any:
    return evaluate(shell_tool(), {"command": command}, agent="alice", chat="main", rules=rules, grants=[_GRANT])


def test_the_session_grant_of_these_tests_runs_other_commands_without_anyone() -> None:
    assert _verdict("ls -la", [_rule("deny", "rm *"), _rule("ask", "chmod *", 2)]).verdict == "allow"
    assert _verdict("nice -n 5 ls", [_rule("deny", "rm *")]).verdict == "allow"


@settings(max_examples=300, deadline=None)
@given(data=st.data(), program=st.sampled_from(["rm", "chmod"]))
def test_every_spelling_of_a_denied_command_is_refused_and_an_asked_one_needs_its_quorum(
        data: st.DataObject, program: str) -> None:
    command = data.draw(_spelling(program))
    denied = _verdict(command, [_rule("deny", f"{program} *")])
    assert denied.verdict == "deny", (command, denied)
    asked = _verdict(command, [_rule("ask", f"{program} *", 2)])
    assert (asked.verdict, asked.source.get("approvals_required")) == ("ask", 2), (command, asked)


def test_an_allow_wildcard_never_covers_a_comment() -> None:
    assert glob_matches("git push * --dry-run", "git push origin main --dry-run")
    for spelled in ("git push origin main # --dry-run", "git push origin main\t# --dry-run",
                    "git push #x --dry-run", "git push origin main #--dry-run"):
        assert not glob_matches("git push * --dry-run", spelled), spelled
        assert not glob_matches("git push ? --dry-run", spelled.replace("origin main", "o")), spelled
    assert glob_matches("echo *", "echo issue#28")  # a `#` inside a word is text
    assert glob_matches("echo * # note", "echo hi # note")  # a comment the rule spells out


# -- through the engine ----------------------------------------------------------------------

# At least 30 spellings the engine receives from the LLM in one turn, under a session grant.
_THROUGH_ENGINE = [
    "/bin/rm -rf x", "/usr/bin/rm -rf x", "command rm -rf x", "builtin rm -rf x", "exec rm -rf x",
    "env rm -rf x", "env -i PATH=/usr/bin rm -rf x", "nice rm -rf x", "nice -n 5 rm -rf x", "nohup rm -rf x",
    "timeout 5 rm -rf x", "timeout -s KILL 5 rm -rf x", "stdbuf -oL rm -rf x", "time rm -rf x", "setsid rm -rf x",
    "sudo rm -rf x", "doas rm -rf x", "busybox rm -rf x", "ionice -c 3 rm -rf x", "rm\t-rf x",
    "A=1 /bin/rm -rf x", "find . -name x -delete", "echo x | xargs rm -rf", "sh -c 'rm -rf x'",
    "python3 -c 'import shutil; shutil.rmtree(\"x\")'", "perl -e 'system(\"rm -rf x\")'", "'rm' -rf x",
    "r\\m -rf x", "$(echo rm) -rf x", "/bin/chmod 777 x", "command chmod 777 x", "nice chmod 777 x",
    "timeout 5 chmod 777 x", "nohup chmod 777 x", "chmod\t777 x", "sudo -u root /usr/bin/chmod 777 x",
    "find . -name x -exec chmod 777 {} +", "echo x | xargs chmod 777", "bash -c 'chmod 777 x'",
    "awk 'BEGIN{system(\"chmod 777 x\")}'",
]


def _victim(harness: Harness) -> Path:
    victim = harness.engine.workspace_for(harness.world) / "x"
    victim.mkdir(exist_ok=True)
    (victim / "kept.txt").write_text("kept")
    os.chmod(victim, 0o700)
    return victim


async def _with_session_grant(harness: Harness) -> None:
    """A world whose agent alice holds a "for this chat" grant for shell_exec, and the turn that made it."""
    await harness.make_world("alice")
    harness.double.respond_with(lambda body: Text("done") if body["messages"][-1]["role"] == "tool"
                                else tool_calls(*[("shell_exec", {"command": c}) for c in _THROUGH_ENGINE])
                                if "all spellings" in body["messages"][-1]["content"] else run_on_request(body))
    await harness.say("run echo granted >> ran.txt")
    [first] = await harness.wait_pending(1)
    await harness.decide(first["id"], "approve", "session")
    await harness.idle()
    assert [e["grant"]["tool"] for e in await harness.engine.approvals.grants(harness.world)] == ["shell_exec"]


async def test_every_spelling_is_refused_by_a_deny_rule_under_a_session_grant(harness: Harness) -> None:
    await _with_session_grant(harness)
    for program in ("rm", "chmod"):
        await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": f"{program} *"},
                                                "deny", reason=f"no {program}")
    victim = _victim(harness)
    await harness.say("@alice all spellings")
    results = await harness.wait_for(lambda e: e.get("role") == "tool" and not e.get("decision"),
                                     count=len(_THROUGH_ENGINE) + 1, timeout=30)
    refused = [json.loads(r["content"]).get("error", r["content"]) for r in results[1:]]
    assert all("denied by rule" in error for error in refused), refused
    await harness.idle(timeout=20)
    assert (victim / "kept.txt").read_text() == "kept" and victim.stat().st_mode & 0o777 == 0o700


async def test_every_spelling_needs_two_people_under_an_ask_rule_and_a_session_grant(harness: Harness) -> None:
    await _with_session_grant(harness)
    for program in ("rm", "chmod"):
        await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": f"{program} *"},
                                                "ask", approvals_required=2)
    victim = _victim(harness)
    await harness.say("@alice all spellings")
    pending = await harness.wait_pending(len(_THROUGH_ENGINE), timeout=30)
    assert sorted(p["request"]["toolArguments"]["command"] for p in pending) == sorted(_THROUGH_ENGINE)
    assert {p["request"].get("approvalsRequired") for p in pending} == {2}
    assert (victim / "kept.txt").read_text() == "kept" and victim.stat().st_mode & 0o777 == 0o700


async def _one_request(harness: Harness, effect: str, pattern: str, command: str, **rule: Any) -> dict[str, Any]:
    """A world with one rule for shell_exec, and the request of the call `command` the agent then makes."""
    await harness.make_world("alice")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {"command": pattern}, effect, **rule)
    harness.double.respond_with(run_on_request)
    await harness.say(f"run {command}", actor=OWNER)
    [pending] = await harness.wait_pending(1)
    assert pending["request"]["toolArguments"]["command"] == command
    return pending


async def test_an_allow_rule_does_not_run_what_a_comment_hides_from_it(harness: Harness) -> None:
    await _one_request(harness, "allow", "touch * --dry-run", "touch pushed # --dry-run")
    assert not (harness.engine.workspace_for(harness.world) / "pushed").exists()


async def test_an_edit_into_a_path_spelled_command_needs_the_ask_rule_s_two_people(harness: Harness) -> None:
    """An edit is checked as if the LLM had written it: into `/bin/chmod 777 .` under a two-person
    `chmod *` rule, it is refused as an edit (a request that needs several people is never edited)."""
    pending = await _one_request(harness, "ask", "chmod *", "echo harmless >> ran.txt", approvals_required=2)
    assert pending["request"].get("approvalsRequired") is None  # one person's approval, as asked
    workspace = harness.engine.workspace_for(harness.world)
    os.chmod(workspace, 0o755)
    for edited in ("/bin/chmod 777 .", "nice /usr/bin/chmod 777 .", "sh -c 'chmod 777 .'"):
        with pytest.raises(AppError) as caught:
            await harness.decide(pending["id"], "approve", arguments={"command": edited}, actor=MEMBER)
        assert caught.value.code == vocab.FORBIDDEN and "needs 2 approvals" in caught.value.message, edited
    assert [p["id"] for p in await harness.engine.pending_approvals(harness.world)] == [pending["id"]]
    assert workspace.stat().st_mode & 0o777 == 0o755
