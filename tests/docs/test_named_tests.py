"""The documentation names the test that pins each guarantee: every test a markdown page names exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md",
                *(ROOT / "docs").glob("*.md")])
# `tests/<layer>/test_x.py::test_y`, `test_x.py::test_y`, or `::test_y` (same file as the reference before it)
_REFERENCE = re.compile(r"`(?:(?:tests/(?:\w+/)?)?(test_\w+\.py))?::(test_\w+)`")
# Test files by name (names are unique across the layers of tests/)
_FILES = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _named_tests(page: Path) -> list[tuple[str, str]]:
    """(file, test) for every test `page` names, in order."""
    named: list[tuple[str, str]] = []
    current = None
    for match in _REFERENCE.finditer(page.read_text(encoding="utf-8")):
        current = match.group(1) or current
        assert current, f"{page.relative_to(ROOT)}: {match.group(0)} names no file"
        named.append((current, match.group(2)))
    return named


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_test_a_page_names_exists(page: Path) -> None:
    missing = [f"{file}::{test}" for file, test in _named_tests(page)
               if file not in _FILES or test not in _tests_in(_FILES[file])]
    assert not missing, f"{page.relative_to(ROOT)} names tests that do not exist: {missing}"


def test_the_guarantees_page_names_the_tests_that_pin_them() -> None:
    assert len(_named_tests(ROOT / "docs" / "guarantees.md")) >= 15
