"""What a shell command line runs, as deny and ask rules need to see it: its simple commands, each with
the program's name (not its path) first, the wrappers that only run another program looked through,
and a flag for those whose real work this reading cannot see (`sh -c`, `xargs`, `find -delete`, …).

This is a guard's reading, not a shell: where it is unsure it says `opaque`, and a rule then treats the
command as one it covers (server/tools/globs.py). The sandbox, not this, is the boundary.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_BLANKS = " \t"
_ENDS_COMMAND = ";&|()\n"
# Words that start or shape a compound command rather than name a program (`if rm x; then …`).
_KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until",
                       "case", "esac", "for", "select", "in", "function", "[[", "]]", "coproc"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
# A program word the shell runs as written: no quoting, expansion, globbing or brace expansion in it.
_PLAIN_PROGRAM = re.compile(r"[A-Za-z0-9_./+:@%^,=-]+")


@dataclass(frozen=True)
class _Wrapper:
    """A program that runs the rest of its words as another command, and how its options read."""
    flags: str = ""  # short options without an argument
    with_arg: str = ""  # short options that take one (`-n 5`, `-n5`)
    long_flags: tuple[str, ...] = ()
    long_with_arg: tuple[str, ...] = ()
    operands: int = 0  # words after the options before the command (`timeout 5 rm`)
    hiding: tuple[str, ...] = ()  # options that make it run a shell or a string we cannot see into
    bare_dash: bool = False  # a lone `-` is an option (`env -`, the same as `env -i`)


_WRAPPERS = {
    "command": _Wrapper(flags="pvV"), "builtin": _Wrapper(), "exec": _Wrapper(flags="cl", with_arg="a"),
    "nohup": _Wrapper(), "busybox": _Wrapper(),
    "nice": _Wrapper(with_arg="n", long_with_arg=("adjustment",)),
    "timeout": _Wrapper(flags="v", with_arg="sk", long_flags=("foreground", "preserve-status", "verbose"),
                        long_with_arg=("signal", "kill-after"), operands=1),
    "stdbuf": _Wrapper(with_arg="ioe", long_with_arg=("input", "output", "error")),
    "time": _Wrapper(flags="pvaq", with_arg="fo", long_flags=("portability", "verbose", "append", "quiet"),
                     long_with_arg=("format", "output")),
    "setsid": _Wrapper(flags="cfw", long_flags=("ctty", "fork", "wait")),
    "sudo": _Wrapper(flags="AbEHknPSBNsie", with_arg="ugCDhprtTUR",
                     long_flags=("askpass", "background", "preserve-env", "set-home", "non-interactive",
                                 "stdin", "bell", "shell", "login", "edit"),
                     long_with_arg=("user", "group", "close-from", "chdir", "host", "prompt", "role", "type",
                                    "command-timeout", "other-user", "chroot"),
                     hiding=("-s", "-i", "-e", "--shell", "--login", "--edit")),
    "doas": _Wrapper(flags="nSs", with_arg="uC", hiding=("-s", "-S")),
    "ionice": _Wrapper(flags="t", with_arg="cnp", long_flags=("ignore",), long_with_arg=("class", "classdata", "pid")),
    "chrt": _Wrapper(flags="abdefiormRv", with_arg="TPD", long_flags=("all-tasks", "batch", "deadline", "fifo",
                                                                       "idle", "other", "rr", "reset-on-fork",
                                                                       "verbose"),
                     long_with_arg=("sched-runtime", "sched-period", "sched-deadline"), operands=1),
    "taskset": _Wrapper(flags="acp", long_flags=("all-tasks", "cpu-list", "pid"), operands=1),
    "env": _Wrapper(flags="i0v", with_arg="uCS", long_flags=("ignore-environment", "null", "debug"),
                    long_with_arg=("unset", "chdir", "split-string"), hiding=("-S", "--split-string"),
                    bare_dash=True),
    "chroot": _Wrapper(long_with_arg=("userspec", "groups"), operands=1),
}
# Programs that run text or files given to them, or other programs by their own rules: never seen into.
# Wrappers not read option by option (setpriv, prlimit, …) are here too: what they run is not looked for.
_HIDING = frozenset({"eval", "source", ".", "xargs", "parallel", "watch", "su", "runuser", "script", "trap",
                     "flock", "unshare", "nsenter", "strace", "ltrace", "valgrind", "gdb", "expect", "at",
                     "batch", "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "yash",
                     "posh", "rbash", "pwsh", "fc", "alias", "ed", "ex",
                     "setpriv", "prlimit", "setarch", "linux32", "linux64", "i386", "x86_64", "logsave",
                     "ssh-agent", "choom", "chpst", "sg", "newgrp", "pkexec", "systemd-run", "firejail",
                     "faketime", "torsocks", "proxychains", "proxychains4", "eatmydata", "nocache", "cgexec",
                     "xvfb-run", "dbus-run-session", "catchsegv", "chronic", "ifne", "numactl", "cpulimit"})
_INTERPRETER = re.compile(r"(python|pypy|perl|ruby|node|nodejs|php|lua|luajit|tclsh|wish|deno|bun|Rscript|julia"
                          r"|osascript|jshell|irb|groovy)[0-9.]*")
_AWK = frozenset({"awk", "gawk", "mawk", "nawk"})
# sed's `e` command and the `e` flag of `s///` run the pattern space as a command (GNU sed).
_SED_RUNS = re.compile(r"(^|[;\n{}])\s*e(\s|$)|^s(.).*\3.*\3[a-zA-Z0-9]*e")
_FIND_RUNS = frozenset({"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"})


@dataclass(frozen=True)
class Command:
    """One simple command. `forms`: its text at each level of wrapping, outermost first, each with its
    program's name for its path and single spaces between unquoted words (`sudo nice rm -rf x`,
    `nice rm -rf x`, `rm -rf x`); `opaque`: it runs something these words do not show."""
    forms: tuple[str, ...]
    opaque: bool


@dataclass
class _Word:
    text: str = ""  # after quote removal
    plain: bool = True  # no quoting, expansion or substitution in it


@dataclass
class _Scan:
    commands: list[list[_Word]]
    nested: list[str]  # the texts of `$(…)`, backticks and `<(…)`: commands of their own
    heredoc: bool = False


def _closing(text: str, i: int) -> int:
    """The index of the `)` closing the group opened just before `i` (or the text's end)."""
    depth, quote = 1, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text)


def _backtick_end(text: str, i: int) -> int:
    while i < len(text) and text[i] != "`":
        i += 2 if text[i] == "\\" else 1
    return min(i, len(text))


def _scan(text: str) -> _Scan:
    out = _Scan([], [])
    words: list[_Word] = []
    word: _Word | None = None
    redirect = False  # the next word is a redirection's target, not an argument
    i, n = 0, len(text)

    def end_word() -> None:
        nonlocal word, redirect
        if word is not None:
            if not redirect:
                words.append(word)
            redirect = False
            word = None

    def end_command() -> None:
        nonlocal words
        end_word()
        if words:
            out.commands.append(words)
        words = []

    def substitution(at: int) -> int:
        """`$(…)` or `<(…)` opening at `at` (its `(`): keep its text; return the index after it."""
        end = _closing(text, at + 1)
        out.nested.append(text[at + 1:end])
        return end + 1

    while i < n:
        c = text[i]
        if word is None and c == "#":  # a comment, to the end of the line
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in _BLANKS:
            end_word()
            i += 1
            continue
        if c in "<>" or (c == "&" and text[i + 1:i + 2] == ">"):
            if text[i + 1:i + 2] == "(" and c != "&":  # process substitution: a command of its own
                word = word or _Word()
                word.plain = False
                i = substitution(i + 1)
                continue
            if word is not None and word.text.isdigit() and word.plain:
                word = None  # `2>`: the descriptor, not a word
            end_word()
            op = re.match(r"&>>?|<<<|<<-?|<>|<&|>&|>>|>\||<|>", text[i:])
            assert op is not None
            out.heredoc = out.heredoc or (op.group().startswith("<<") and op.group() != "<<<")
            redirect = True
            i += len(op.group())
            continue
        if c in _ENDS_COMMAND:
            end_command()
            redirect = False
            i += 1
            continue
        word = word or _Word()
        if c == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            word.text += text[i + 1:end]
            word.plain = False
            i = end + 1
        elif c == "\\":
            if text[i + 1:i + 2] == "\n":  # a line continuation joins the word with the next line
                i += 2
                continue
            word.text += text[i + 1:i + 2]
            word.plain = False
            i += 2
        elif c == '"':
            word.plain = False
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    word.text += text[i + 1:i + 2]
                    i += 2
                elif text[i:i + 2] == "$(":
                    i = substitution(i + 1)
                elif text[i] == "`":
                    end = _backtick_end(text, i + 1)
                    out.nested.append(text[i + 1:end])
                    i = end + 1
                else:
                    word.text += text[i]
                    i += 1
            i += 1
        elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
            word.plain = False
            if text[i + 1] == "(":
                i = substitution(i + 1)
            else:  # `${x:-$(…)}`: what it holds may run too
                end = text.find("}", i)
                end = n if end < 0 else end
                out.nested.append(text[i + 2:end])
                i = end + 1
        elif c == "`":
            word.plain = False
            end = _backtick_end(text, i + 1)
            out.nested.append(text[i + 1:end])
            i = end + 1
        else:
            if c == "$":
                word.plain = False
            word.text += c
            i += 1
    end_command()
    return out


def _options(wrapper: _Wrapper, words: list[_Word], i: int) -> int | None:
    """The index of the wrapper's command after its options and operands; None when it cannot be told
    (an option it does not know) or the wrapper runs a shell or a string."""
    while i < len(words) and words[i].text.startswith("-"):
        word = words[i].text
        if word == "-":
            if not wrapper.bare_dash:
                break
            i += 1
            continue
        if word in wrapper.hiding or not words[i].plain:
            return None
        i += 1
        if word == "--":
            break
        if word.startswith("--"):
            name = word[2:].split("=", 1)[0]
            if name in wrapper.long_with_arg:
                i += 0 if "=" in word else 1
            elif name not in wrapper.long_flags:
                return None
            continue
        for at, letter in enumerate(word[1:], start=1):
            if f"-{letter}" in wrapper.hiding:
                return None
            if letter in wrapper.with_arg:
                i += 0 if word[at + 1:] else 1  # `-n5` or `-n 5`
                break
            if letter not in wrapper.flags and not letter.isdigit():  # `nice -5`
                return None
    while i < len(words) and _ASSIGNMENT.match(words[i].text):  # `env A=1 rm`
        i += 1
    return i + wrapper.operands


def _runs_hidden_code(name: str, args: list[_Word]) -> bool:
    """Whether a program we do look at runs code given as text, read from stdin, or other programs."""
    texts = [w.text for w in args]
    if name == "find":
        return any(t in _FIND_RUNS for t in texts)
    if name in ("sed", "gsed"):
        return any(t in ("-f", "--file") or t.startswith("--file=") or _SED_RUNS.search(t) for t in texts)
    if name == "git":  # `git -c alias.x='!rm -rf x' x`: a config given here can make any command run
        return any(t == "-c" or t.startswith(("-c", "--config-env")) for t in texts)
    if name in _AWK:
        return any("system" in t or "|" in t or t in ("-f", "-E", "--file", "--exec") for t in texts)
    if _INTERPRETER.fullmatch(name):
        options = [t for t in texts if t.startswith("-")]
        # `-c`, `-e`, `-E`, `-r` (php), `-p` (node) anywhere in a cluster, `--eval`; or no script: stdin.
        return (any((t.startswith("--") and t[2:].split("=")[0] in ("eval", "print", "command")) or (not
                    t.startswith("--") and any(x in t[1:] for x in "ceErp")) for t in options)
                or all(t.startswith("-") for t in texts) or "-" in texts)
    return False


def _command(words: list[_Word]) -> Command:
    while words and ((words[0].text in _KEYWORDS and words[0].plain) or _ASSIGNMENT.match(words[0].text)):
        words = words[1:]
    forms: list[str] = []
    while words:
        program = words[0]
        if not program.plain or not _PLAIN_PROGRAM.fullmatch(program.text):
            return Command(tuple(forms), True)  # `$cmd`, `"rm"`, `r\m`, `/bin/r?`, `{rm,-rf,x}`: unseen
        name = program.text.rsplit("/", 1)[-1] or program.text
        forms.append(" ".join([name, *(w.text for w in words[1:])]))
        if name in _HIDING or _runs_hidden_code(name, words[1:]):
            return Command(tuple(forms), True)
        wrapper = _WRAPPERS.get(name)
        if wrapper is None:
            break
        start = _options(wrapper, words, 1)
        if start is None:
            return Command(tuple(forms), True)
        words = words[start:]
    return Command(tuple(forms), False)


def commands(text: str) -> list[Command]:
    """The simple commands `text` runs, those inside substitutions included. A here-document makes
    them all opaque (its body is text a program reads: we do not know which)."""
    scan = _scan(text)
    found = [_command(words) for words in scan.commands]
    for inner in scan.nested:
        found += commands(inner)
    if scan.heredoc:
        found = [Command(c.forms, True) for c in found] or [Command((), True)]
    return found
