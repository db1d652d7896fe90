"""constraints.txt pins every dependency pyproject.toml names, within its bounds: a fresh machine gets
the versions CI tested (./dev installs with `-c constraints.txt`)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt pins exact versions (name==version), not {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    return [Requirement(r) for r in [*project["dependencies"], *(r for group in extras.values() for r in group)]]


def test_every_dependency_is_pinned_within_its_bounds() -> None:
    pins = _pins()
    missing = sorted(str(r) for r in _requirements() if canonicalize_name(r.name) not in pins)
    assert not missing, (f"constraints.txt has no pin for {missing}: install it in .venv, then "
                         "`.venv/bin/pip freeze | grep -v '^-e\\|^#'` gives the line")
    outside = sorted(f"{r} (pinned {pins[canonicalize_name(r.name)]})" for r in _requirements()
                     if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True))
    assert not outside, f"constraints.txt pins versions pyproject.toml refuses: {outside}"
