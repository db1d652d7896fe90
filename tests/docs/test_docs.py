"""docs/protocol.md documents everything the code offers, and nothing it does not (in datasette's style).

The code side is read from the code itself: routes from the assembled app, event kinds, frame types and
error codes from the source (by its syntax tree), settings from DEFAULT_SETTINGS. The document side is
read from its headings and tables, so a failure names exactly what to add or remove, and where.
No server process: this runs in about a second.
"""
from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Mount, Route, WebSocketRoute

from server import errors, vocab
from server.app import ServerConfig, create_app
from server.engine.world.worlds import DEFAULT_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
# Every markdown page of the project: the generic checks (links, anchors, paths) read them all.
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md",
                *(ROOT / "docs").glob("*.md")])
ROUTE_HEADING = re.compile(r"^`(GET|POST|PUT|PATCH|DELETE|WS) (/[^`\s]*)`$")
NAME_HEADING = re.compile(r"^`([a-z_]+)`$")
TABLE_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*([^|]*?)\s*\|")


# -- the document ----------------------------------------------------------------------
@dataclass
class Heading:
    level: int
    title: str
    section: int | None  # the number of the enclosing "## N. …" section
    parent: str  # the enclosing ### heading's title ("" at level 3 and above)
    examples: list[str] = field(default_factory=list)  # the ```json blocks right under it
    text: list[str] = field(default_factory=list)  # its prose and tables (not code), up to the next heading


@dataclass(frozen=True)
class Doc:
    headings: tuple[Heading, ...]
    rows: tuple[tuple[int | None, str, str], ...]  # (section, first cell's `name`, second cell)

    def names(self, section: int, *, level: int | None = None, parent: str | None = None) -> set[str]:
        """The `name`s of the headings of `section` (at `level`, under the ### heading `parent`)."""
        return {m.group(1) for h in self.headings
                if h.section == section and (level is None or h.level == level)
                and (parent is None or h.parent == parent) and (m := NAME_HEADING.match(h.title))}

    def examples(self, section: int, *, level: int, parent: str | None = None) -> dict[str, list[str]]:
        """`name` -> the JSON examples under each `name` heading of `section`."""
        return {m.group(1): h.examples for h in self.headings
                if h.section == section and h.level == level and (parent is None or h.parent == parent)
                and (m := NAME_HEADING.match(h.title))}

    def prose(self, title: str) -> str:
        """The text under the heading titled `title` (up to the next heading of any level)."""
        found = [h for h in self.headings if h.title == title]
        assert len(found) == 1, f"docs/protocol.md needs exactly one heading {title!r} (found {len(found)})"
        return "\n".join(found[0].text)

    def routes(self) -> set[str]:
        return {f"{m.group(1)} {m.group(2)}" for h in self.headings if (m := ROUTE_HEADING.match(h.title))}

    def table(self, section: int) -> dict[str, str]:
        return {name: cell for s, name, cell in self.rows if s == section}


def _read_doc() -> Doc:
    headings: list[Heading] = []
    rows: list[tuple[int | None, str, str]] = []
    section: int | None = None
    parent = ""
    fenced: list[str] | None = None  # the lines of the ```json block being read
    in_code = False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if in_code and fenced is not None and headings:
                headings[-1].examples.append("\n".join(fenced))
            in_code = not in_code
            fenced = [] if in_code and line.strip() == "```json" else None
            continue
        if in_code:
            if fenced is not None:
                fenced.append(line)
            continue
        if m := re.match(r"^(#{2,4}) (.+?)\s*$", line):
            level, title = len(m.group(1)), m.group(2)
            if level == 2:
                number = re.match(r"^(\d+)\.", title)
                section, parent = (int(number.group(1)) if number else None), ""
            elif level == 3:
                parent = title
            headings.append(Heading(level, title, section, parent if level == 4 else ""))
            continue
        if headings:
            headings[-1].text.append(line)
        if m := TABLE_ROW.match(line):
            rows.append((section, m.group(1), m.group(2)))
    return Doc(tuple(headings), tuple(rows))


@pytest.fixture(scope="module")
def doc() -> Doc:
    return _read_doc()


def _section_number(doc: Doc, starts_with: str) -> int:
    """The number of the `## N. <title>` section whose title starts with `starts_with`."""
    for h in doc.headings:
        if h.level == 2 and re.match(rf"^\d+\. {re.escape(starts_with)}", h.title):
            assert h.section is not None
            return h.section
    raise AssertionError(f"docs/protocol.md has no section '## N. {starts_with}…'")


def _same(documented: set[str], actual: set[str], what: str, how: str) -> None:
    """One readable failure for both directions: what the doc misses and what it has in excess."""
    missing, extra = sorted(actual - documented), sorted(documented - actual)
    problems = []
    if missing:
        problems.append(f"{what} missing from docs/protocol.md ({how}): {missing}")
    if extra:
        problems.append(f"docs/protocol.md documents {what} that the code does not have: {extra}")
    assert not problems, "\n".join(problems)


# -- the code ----------------------------------------------------------------------------
def _modules(*folders: str) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, _parsed(path)


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _vocab_value(node: ast.expr) -> Any:
    """The value of `vocab.X` (or `vocab.X.Y`), else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not (isinstance(node, ast.Name) and node.id == "vocab" and parts):
        return None
    value: Any = vocab
    for part in reversed(parts):
        value = getattr(value, part, None)
    return value


def _constants(module: ast.Module) -> dict[str, Any]:
    """Module-level `NAME = <literal>` and `NAME: T = <literal>` assignments."""
    out: dict[str, Any] = {}
    for node in module.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                resolved = _literal(value)
                if resolved is not None:
                    out[target.id] = resolved
    return out


def _literal(node: ast.expr) -> Any:
    """A literal's value, reading `vocab.X` inside dicts too (e.g. {404: vocab.NOT_FOUND}); else None."""
    if isinstance(node, ast.Dict):
        pairs = zip(node.keys, node.values, strict=True)
        items = {_literal(k) if k is not None else None: _literal(v) for k, v in pairs}
        return None if None in items or None in items.values() else items
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _vocab_value(node)


def _string(node: ast.expr, constants: dict[str, Any]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and isinstance(constants.get(node.id), str):
        return str(constants[node.id])
    value = _vocab_value(node)
    return str(value) if isinstance(value, str) else None


def code_routes(data_dir: Path) -> set[str]:
    """Every route of the assembled app (API, WebSocket, operations and the installed web extension).
    Only built, never started: `data_dir` stays untouched."""
    app = create_app(ServerConfig(data_dir=data_dir, token="t" * 40))
    out: set[str] = set()
    for route in app.routes:
        if isinstance(route, Route):
            out |= {f"{method} {route.path}" for method in (route.methods or {"GET"}) - {"HEAD"}}
        elif isinstance(route, WebSocketRoute):
            out.add(f"WS {route.path}")
        elif isinstance(route, Mount):
            out.add(f"GET {route.path}/{{path}}")
        else:
            raise AssertionError(f"test_docs does not know how to name {route!r}: teach code_routes()")
    return out


def code_event_kinds() -> set[str]:
    """The kinds declared in vocab.py (`EventKind`, or its 'Event kinds' block), and every `"kind": vocab.…`
    the code appends."""
    kinds: set[str] = set()
    enum = getattr(vocab, "EventKind", None)
    if enum is not None:
        kinds |= {str(member) for member in enum}
    block = vocab.__file__ and Path(vocab.__file__).read_text(encoding="utf-8").split("# Event kinds", 1)
    if len(block) == 2:
        declarations = block[1].split("\n\n", 1)[0]
        kinds |= set(re.findall(r'^[A-Z_]+(?:: Final)? = "([a-z_]+)"', declarations, re.MULTILINE))
    for _, module in _modules("server", "web"):
        for node in ast.walk(module):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    # Events name their kind from vocab; other dicts with a "kind" (view models) are not events.
                    if isinstance(key, ast.Constant) and key.value == "kind" and value is not None:
                        kind = _vocab_value(value)
                        if isinstance(kind, str):
                            kinds.add(str(kind))
    assert kinds, "found no event kinds in server/vocab.py or the code: teach code_event_kinds() where they are"
    return kinds


_NOT_FRAMES = {"object", "string", "integer", "number", "boolean", "array", "null", "function", "text"}


def code_server_frame_types() -> set[str]:
    """`{"type": "<t>", …}` dict literals of the API, engine and bus: the JSON frames they send."""
    types: set[str] = set()
    for _, module in _modules("server/api", "server/engine", "server/bus"):
        for node in ast.walk(module):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (isinstance(key, ast.Constant) and key.value == "type" and isinstance(value, ast.Constant)
                            and isinstance(value.value, str) and "." not in value.value
                            and value.value not in _NOT_FRAMES):
                        types.add(value.value)
    assert types, "found no server frames: teach code_server_frame_types() where they are built"
    return types


def _compared_kinds(path: Path, function: str) -> set[str]:
    """The strings `kind`/`type` is compared with in `function` of `path` (the frame types it accepts)."""
    module = _parsed(path)
    found: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            for compare in ast.walk(node):
                if (isinstance(compare, ast.Compare) and isinstance(compare.left, ast.Name)
                        and compare.left.id in ("kind", "type")):
                    found |= {c.value for c in compare.comparators
                              if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assert found, (f"found no frame types compared in {path.relative_to(ROOT)}:{function}: "
                   "teach tests/docs/test_docs.py where client frames are told apart now")
    return found


def code_error_codes() -> dict[str, set[int | None]]:
    """Every error code the code can answer with, and the HTTP statuses it comes with (None: frames only)."""
    declared = {str(c) for c in getattr(vocab, "ErrorCode", ())} | {str(c) for c in getattr(errors, "_STATUS", {})}
    codes: dict[str, set[int | None]] = {code: {_status_of(code)} for code in declared}

    def add(code: str | None, status: int | None) -> None:
        if code is not None:
            codes.setdefault(code, set()).add(status)

    for _, module in _modules("server", "web"):
        constants = _constants(module)
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name == "AppError" and node.args:
                first = node.args[0]
                status = next((k.value.value for k in node.keywords if k.arg == "status"
                               and isinstance(k.value, ast.Constant)), None)
                if status is None and len(node.args) > 2 and isinstance(node.args[2], ast.Constant):
                    status = node.args[2].value
                status = status if isinstance(status, int) else None
                if (isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "get"
                        and isinstance(first.func.value, ast.Name)):  # AppError(TABLE.get(status, "default"), …)
                    for status_key, code in (constants.get(first.func.value.id) or {}).items():
                        add(_string_value(code), status_key)
                    for default in first.args[1:]:
                        add(_string(default, constants), None)
                    continue
                code = _string(first, constants)
                add(code, status if status is not None else _status_of(code))
            elif name == "refuse" and len(node.args) > 2:  # Refusals.refuse(world, actor, code, message)
                code = _string(node.args[2], constants)
                add(code, _status_of(code))
            elif name == "error_text" and node.args:  # a WebSocket error frame: no HTTP status of its own
                code = _string(node.args[0], constants)
                if code is not None and code not in codes:
                    add(code, None)
    return codes


def _status_of(code: str | None) -> int:
    """The HTTP status an AppError with `code` gets by default, wherever the code keeps that table."""
    return errors.AppError(code or "", "").status


def _string_value(value: Any) -> str | None:
    return str(value) if isinstance(value, str) else None


# -- the tests ---------------------------------------------------------------------------
def test_every_route_of_the_app_is_documented_and_every_documented_route_exists(doc: Doc, tmp_path: Path) -> None:
    _same(doc.routes(), code_routes(tmp_path), "routes", "add a heading like ### `GET /api/worlds/{world}/events`")


def test_every_event_kind_is_documented_in_the_events_section(doc: Doc) -> None:
    events = _section_number(doc, "Events")
    _same(doc.names(events, level=3), code_event_kinds(), "event kinds",
          f"add a heading like ### `tool_started` under ## {events}. Events, with an example")


def test_every_json_websocket_frame_type_is_documented_both_ways(doc: Doc) -> None:
    ws = _section_number(doc, "WebSocket")
    _same(doc.names(ws, level=4, parent="Server → client"), code_server_frame_types(),
          "server → client frame types", f"add #### `type` under ## {ws}. WebSocket, ### Server → client")
    _same(doc.names(ws, level=4, parent="Client → server"),
          _compared_kinds(ROOT / "server/api/live/json_frames.py", "parse_client_frame"),
          "client → server frame types", f"add #### `type` under ## {ws}. WebSocket, ### Client → server")


def test_documented_client_frames_are_accepted_by_the_json_websocket(doc: Doc) -> None:
    """The other direction, by behaviour: a documented frame type is never refused as unknown."""
    from server.api.live.json_frames import BadFrame, parse_client_frame

    ws = _section_number(doc, "WebSocket")
    for kind in doc.names(ws, level=4, parent="Client → server"):
        try:
            parse_client_frame({"text": json.dumps({"type": kind})})
        except BadFrame as exc:
            assert "unknown frame type" not in exc.message, f"documented frame {kind!r} is refused: {exc.message}"


def test_every_page_socket_frame_type_is_documented(doc: Doc) -> None:
    app = _section_number(doc, "The browser app")
    _same(doc.names(app, level=4, parent="Page socket: client → server"),
          _compared_kinds(ROOT / "web/live.py", "handle"), "page socket frame types",
          f"add #### `type` under ## {app}. The browser app, ### Page socket: client → server")


def test_every_error_code_is_documented_with_its_status(doc: Doc) -> None:
    section = _section_number(doc, "Errors")
    table = doc.table(section)
    codes = code_error_codes()
    _same(set(table), set(codes), "error codes", f"add a row | `code` | status | when | under ## {section}. Errors")
    wrong: dict[str, tuple[str, object]] = {}
    for code, statuses in codes.items():
        shown = table.get(code, "")
        known = statuses - {None}
        if len(known) == 1 and shown != str(next(iter(known))):
            wrong[code] = (shown, next(iter(known)))
        if not known and shown.isdigit():
            wrong[code] = (shown, "no HTTP status (WebSocket only): write —")
    assert not wrong, f"error codes documented with the wrong status (documented, actual): {wrong}"


def test_every_world_setting_is_documented_with_its_default(doc: Doc) -> None:
    section = _section_number(doc, "World settings")
    table = doc.table(section)
    _same(set(table), set(DEFAULT_SETTINGS), "world settings",
          f"add a row | `setting` | `default` | meaning | under ## {section}. World settings")
    wrong: dict[str, tuple[str, str]] = {}
    for key, default in DEFAULT_SETTINGS.items():
        shown = table[key].strip("`")
        if json.loads(shown) != default:
            wrong[key] = (shown, json.dumps(default))
    assert not wrong, f"world settings documented with the wrong default (documented, actual): {wrong}"


def test_every_example_in_the_document_is_valid_json() -> None:
    """A client author copies the examples: each ```json block must parse."""
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) > 30
    broken = []
    for block in blocks:
        try:
            json.loads(block)
        except ValueError as exc:
            broken.append(f"{exc}: {block[:80]!r}")
    assert not broken, "examples in docs/protocol.md that are not JSON:\n" + "\n".join(broken)


def test_the_code_and_the_pages_cite_this_document_not_the_shared_contract() -> None:
    """`PROTOCOL §N` and `../shared/PROTOCOL.md` point outside the repository: cite docs/protocol.md §N."""
    stale = []
    sources = [p for folder in ("server", "web", "tests", "bench") for p in sorted((ROOT / folder).rglob("*.py"))]
    for path in [*sources, *PAGES]:
        if path == Path(__file__).resolve():
            continue  # this test names what it looks for
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"(?<!docs/protocol\.md )\bPROTOCOL §|shared/PROTOCOL\.md", line):
                stale.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not stale, "stale citations of the shared contract:\n" + "\n".join(stale)


@pytest.mark.parametrize(("section_title", "level", "parent", "key"), [
    ("Events", 3, None, "kind"),
    ("WebSocket", 4, "Server → client", "type"),
    ("WebSocket", 4, "Client → server", "type"),
    ("The browser app", 4, "Page socket: client → server", "type"),
])
def test_every_event_kind_and_frame_type_has_an_example_of_its_own(doc: Doc, section_title: str, level: int,
                                                                  parent: str | None, key: str) -> None:
    """Under each event or frame heading, a JSON example whose `kind`/`type` is that heading's name."""
    section = _section_number(doc, section_title)
    without = []
    for name, examples in doc.examples(section, level=level, parent=parent).items():
        parsed = [json.loads(e) for e in examples]
        frames = [p.get("event", p) if key == "kind" else p for p in parsed if isinstance(p, dict)]
        if not any(f.get(key) == name for f in frames):
            without.append(name)
    assert not without, (f"headings of ## {section}. {section_title} without a ```json example whose "
                         f"{key!r} is their name: {sorted(without)}")


@pytest.mark.parametrize(("heading", "values"), [
    ("#### `status`", [str(state) for state in (vocab.IDLE, vocab.THINKING, vocab.WAITING_APPROVAL,
                                                 vocab.RUNNING_TOOL, vocab.ERROR)]),
    ("## 2. Access", [str(role) for role in vocab.ROLES]),
    ("## 4. Approvals", [*vocab.APPROVAL_OPTIONS, *vocab.SCOPES, vocab.APPROVE, vocab.DENY]),
], ids=["agent states", "roles", "decisions"])
def test_every_state_role_and_decision_option_is_named_where_it_belongs(doc: Doc, heading: str,
                                                                        values: list[str]) -> None:
    text = doc.prose(heading.split(" ", 1)[1])
    missing = [v for v in values if f"`{v}`" not in text]
    assert not missing, f"docs/protocol.md does not name {missing} (as `value`) under {heading!r}"


# -- every page: links, anchors and paths ---------------------------------------------------
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
# A path of the repository in backticks: `server/api/http.py`, `tests/test_faults_*.py`, `deploy/nginx.conf`.
_PATH = re.compile(r"`((?:server|web|tests|bench|docs|deploy|templates|static|agent_world_client|\.ci)/[^`\s]*)`")


def _prose_lines(page: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of `page` outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation dropped, spaces as
    hyphens, and -1, -2, … after a repeated one."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(page):
        if m := re.match(r"^#{1,6} (.+?)\s*#*\s*$", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_of_a_page_reaches_a_file_and_a_heading_that_exist(page: Path) -> None:
    broken = []
    for number, line in _prose_lines(page):
        for target in [*_LINK.findall(line), *_IMAGE.findall(line)]:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https://…, mailto:…: outside the repository
            path, _, anchor = target.partition("#")
            # `/docs/x.md`: from the repository's root (GitHub's reading), never a `../` out of a page's folder
            file = (ROOT / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: ({target})"
            if not file.exists():
                broken.append(f"{where}: no file {path}")
            elif anchor and (file.suffix != ".md" or anchor not in _anchors(file)):
                broken.append(f"{where}: no heading with the anchor #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, "broken links (a page moved, or a heading was renamed):\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_file_a_page_names_exists(page: Path) -> None:
    """`server/…`, `tests/…` and the like in backticks name files or folders that exist (globs match one)."""
    missing = []
    for number, line in _prose_lines(page):
        for named in _PATH.findall(line):
            path = named.split("::", 1)[0].rstrip(".,:;")
            if "…" in path or "<" in path:
                continue  # a pattern for the reader (`server/llm/<name>.py`), not a path
            if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{page.relative_to(ROOT)}:{number}: {named}")
    assert not missing, "pages name files that do not exist (moved or renamed?):\n" + "\n".join(missing)
