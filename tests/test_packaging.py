"""What we ship but cannot run here (no Docker engine on these machines) is checked by other means."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml

from server.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_compose_services_run_commands_the_cli_accepts() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["redis"]["image"].startswith("redis:")
    apps = [s for s in services.values() if "build" in s]
    assert len(apps) >= 2, "the distributed example runs several processes"
    for service in apps:
        assert (ROOT / service["build"] / "Dockerfile").exists()
        command = service["command"]
        assert command[0] == "agent-world"
        args = build_parser().parse_args(command[1:])
        assert args.redis_url == "redis://redis:6379/0"
        assert "redis" in service["depends_on"]


def test_the_dockerfile_copies_what_exists_and_installs_the_console_script() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in shlex.split(source):
            assert (ROOT / path).exists(), path
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    args = yaml.safe_load(cmd.group(1))
    assert args[0] == "agent-world"
    build_parser().parse_args(args[1:])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["agent-world"] == "server.cli:main"


def test_the_listed_packages_are_every_package_of_the_source_tree() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("server", "web")
             for p in (ROOT / top).rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | set(setuptools["package-dir"])
    assert setuptools["package-dir"] == {"web.templates": "templates", "web.static": "static"}


def test_a_wheel_carries_the_templates_and_static_files_and_renders_from_them(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building leaves build/ and *.egg-info behind
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("server", "web", "templates", "static"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(tmp_path)],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stderr
    wheel = next(tmp_path.glob("agent_world-*.whl"))
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    for name in [*(ROOT / "templates").iterdir(), *(ROOT / "static").iterdir()]:
        assert (installed / "web" / name.parent.name / name.name).read_bytes() == name.read_bytes()
    probe = ("import web.render as r; print(r.__file__); print(r.STATIC / 'htmx.min.js'); "
             "print(r.render('signin.html', message='hello from the wheel'))")
    shown = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(installed)}, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    module, htmx, page = shown.stdout.split("\n", 2)
    assert Path(module).is_relative_to(installed) and Path(htmx).is_relative_to(installed) and Path(htmx).is_file()
    assert "hello from the wheel" in page
