"""The README names the test that pins each guarantee: every test it names exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `tests/test_x.py::test_y`, `test_x.py::test_y`, or `::test_y` (same file as the reference before it)
_REFERENCE = re.compile(r"`(?:(?:tests/)?(test_\w+\.py))?::(test_\w+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_readme_names_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    named, missing, current = 0, [], None
    for match in _REFERENCE.finditer(readme):
        current = match.group(1) or current
        assert current, f"{match.group(0)} names no file"
        named += 1
        if match.group(2) not in _tests_in(ROOT / "tests" / current):
            missing.append(f"{current}::{match.group(2)}")
    assert named >= 15
    assert not missing, f"the README names tests that do not exist: {missing}"
