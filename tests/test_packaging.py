"""What we ship but cannot run here (no Docker engine on these machines) is checked by other means."""
from __future__ import annotations

import re
import shlex
import tomllib
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
