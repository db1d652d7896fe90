"""The import graph of server/ and web/: no circles (a module that needs another's names at import and
call time alike is one module, or the two share a smaller third), the engine never imports the page, and
the parts of server/ keep their layers (storage, tools and providers below the engine, the API above it).
And what starting costs: the MCP, OpenAI and AG-UI SDKs are imported when first used, and Redis's client only
in the distributed mode, not when the server starts."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.fixtures.server import start_server

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "web")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports anywhere (functions too), except under TYPE_CHECKING."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # `from . import x` imports the module x when there is one
                found.add(f"{target}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    edges = set()
    for name in found:
        while name and name not in known:  # `from .log import Op` imports the package server.log
            name = name.rpartition(".")[0]
        if name and name != module:
            edges.add(name)
    return edges


def _graph_here() -> dict[str, set[str]]:
    files = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    known = set(files)
    return {module: _imports(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py", known)
            for module, path in files.items()}


def _graph() -> dict[str, set[str]]:
    """The import graph, parsed in a fresh interpreter: on 3.11, ast.parse beside another thread building an
    AST (a test server's, in this process) can fail with a spurious 'AST constructor recursion depth
    mismatch' (CPython gh-106905)."""
    code = ("import json; from tests.docs.test_imports import _graph_here; "
            "print(json.dumps({m: sorted(i) for m, i in _graph_here().items()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {module: set(imports) for module, imports in json.loads(out).items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, or None (a depth-first search; a package imported by its own modules is fine:
    importing server.engine.x runs server/engine/__init__.py first anyway)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph[module]):
            if module.startswith(other + "."):  # a module's own package
                continue
            if state.get(other) == 1:
                return [*path[path.index(other):], other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_circle_among_server_and_web_modules() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_server_never_imports_web() -> None:
    wrong = sorted(f"{module} imports {other}" for module, imports in _graph().items() if module.startswith("server")
                   for other in imports if other == "web" or other.startswith("web."))
    assert not wrong, wrong


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# `import mcp` costs ~2 s, `import openai` ~1.5 s and `import ag_ui` ~0.1-1 s: paid by a world that connects an
# MCP server or calls an LLM, or by the first AG-UI request, never by a server starting (each test server too).
# `redis` is for the distributed mode only: an embedded server runs without it.
SLOW_SDKS = ("mcp", "mcp_types", "openai", "ag_ui", "redis")


def test_creating_the_app_imports_no_mcp_openai_ag_ui_nor_redis(tmp_path: Path) -> None:
    """In a fresh interpreter, as `agent-world serve` creates it."""
    code = ("import json, sys; from pathlib import Path; from server.app import ServerConfig, create_app; "
            f"create_app(ServerConfig(data_dir=Path({str(tmp_path)!r}), token='t' * 32)); "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {SLOW_SDKS!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_a_served_demo_world_imports_no_mcp_openai_ag_ui_nor_redis(tmp_path: Path) -> None:
    """Started as `agent-world serve` (with the demo world), until it answers /healthz and is stopped."""
    process = start_server(tmp_path / "data", args=[], extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        assert "import time:" in process.log()  # the interpreter does report its imports here
    finally:
        process.stop()
    sdks = "|".join(SLOW_SDKS)  # a line names the module last: `import time: 31 | 354301 |   mcp_types.jsonrpc`
    imported = re.findall(rf"^import time:.*\|\s+((?:{sdks})(?:\.\S+)?)\s*$", process.log(), re.M)
    assert imported == []


def test_an_openai_agent_imports_the_sdk_at_its_first_call_in_a_thread() -> None:
    """Choosing an agent's provider imports nothing; its first call imports the SDK off the event loop."""
    code = ("import asyncio, json, sys, threading\n"
            "from server.llm.providers import DefaultProviders\n"
            "where = []\n"
            "class Watch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'openai': where.append(threading.current_thread() is threading.main_thread())\n"
            "sys.meta_path.insert(0, Watch())\n"
            "async def main():\n"
            "    providers = DefaultProviders()\n"
            "    provider = providers({'provider': 'openai', 'name': 'alice', 'base_url': 'http://127.0.0.1:9/v1'})\n"
            "    chosen = 'openai' in sys.modules\n"
            "    try:\n"
            "        await provider.complete(model='m', messages=[], tools=[])\n"
            "    except Exception as exc:\n"
            "        failed = type(exc).__name__\n"
            "    await providers.aclose()\n"
            "    print(json.dumps({'chosen': chosen, 'on_main_thread': where, 'failed': failed}))\n"
            "asyncio.run(main())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # Imported once, in a worker thread; the call itself then fails to connect, as an LLMError.
    assert json.loads(out) == {"chosen": False, "on_main_thread": [False], "failed": "LLMError"}


# The parts and who may use whom (the layout of server/, docs/architecture.md). Storage, tools and
# providers know nothing of the engine; the engine knows nothing of its API; the API and the page reach
# the engine through its facade (engine.py) and the few plain helpers listed here.
_BELOW_THE_ENGINE = ("server.log", "server.bus", "server.tools", "server.llm")
_ENGINE_FOR_CLIENTS = frozenset({
    "server.engine", "server.engine.engine", "server.engine.actors", "server.engine.public", "server.engine.store",
    "server.engine.world.invites", "server.engine.world.usage", "server.engine.world.files",
    "server.engine.turns.retry_reply",
    "server.engine.approvals.decisions"})


def _imports_of(prefixes: tuple[str, ...], graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((module, other) for module, imports in graph.items()
                  if module.startswith(prefixes) for other in imports)


def test_storage_tools_and_providers_never_import_the_engine_or_its_api() -> None:
    wrong = [f"{m} imports {o}" for m, o in _imports_of(_BELOW_THE_ENGINE, _graph())
             if o.startswith(("server.engine", "server.api", "web"))]
    assert not wrong, wrong


def test_the_engine_never_imports_its_api() -> None:
    wrong = [f"{m} imports {o}" for m, o in _imports_of(("server.engine",), _graph()) if o.startswith("server.api")]
    assert not wrong, wrong


def test_the_api_and_the_page_reach_the_engine_through_its_facade() -> None:
    wrong = [f"{m} imports {o}" for m, o in _imports_of(("server.api", "web"), _graph())
             if o.startswith("server.engine") and o not in _ENGINE_FOR_CLIENTS]
    assert not wrong, wrong


def test_the_layering_test_sees_a_wrong_import() -> None:
    graph = {"server.tools.builtin": {"server.engine.store"}, "web.pages": {"server.engine.turns.runner"}}
    assert _imports_of(_BELOW_THE_ENGINE, graph) == [("server.tools.builtin", "server.engine.store")]
    assert [o for _, o in _imports_of(("web",), graph) if o not in _ENGINE_FOR_CLIENTS] == [
        "server.engine.turns.runner"]
