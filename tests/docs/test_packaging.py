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
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints (types-PyYAML is not installed)

from server.cli import build_parser
from tests.fixtures.proxy import DEPLOY_NGINX, listen_port, upstream_servers

ROOT = Path(__file__).resolve().parents[2]


def _image_command() -> list[str]:
    cmd = re.search(r"^CMD (\[.*\])$", (ROOT / "Dockerfile").read_text(), re.M)
    assert cmd is not None
    command: list[str] = yaml.safe_load(cmd.group(1))
    return command


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose


def _apps(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if "build" in s}


def test_compose_app_replicas_run_the_image_command_with_the_shared_data_volume_and_redis() -> None:
    compose = _compose()
    apps = _apps(compose)
    assert len(apps) >= 2, "the team deployment runs several replicas"
    for name, service in apps.items():
        assert (ROOT / service["build"] / "Dockerfile").exists()
        command = service.get("command") or _image_command()  # the image's, so --data-dir is never lost
        assert command[0] == "agent-world"
        args = build_parser().parse_args(command[1:])
        assert args.data_dir == "/data" and args.host == "0.0.0.0" and args.port == 8000, name
        volumes = [v.split(":") for v in service["volumes"]]
        data = [source for source, target, *_ in volumes if target == args.data_dir]
        assert len(data) == 1 and data[0] in compose["volumes"], f"{name}: the data folder is not a named volume"
        env = service["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "/healthz" in " ".join(service["healthcheck"]["test"]) and service["restart"] == "unless-stopped"
        # A world that allows the network: slirp4netns (in the image) needs the tap device.
        assert "/dev/net/tun:/dev/net/tun" in service.get("devices", []), name
    shared = {tuple(s["volumes"]) for s in apps.values()}
    assert len(shared) == 1, "every replica mounts the same data volume"
    redis = compose["services"]["redis"]
    assert redis["image"].startswith("redis:") and redis["command"][:3] == ["redis-server", "--appendonly", "yes"]
    assert any(v.endswith(":/data") and v.split(":")[0] in compose["volumes"] for v in redis["volumes"])


def test_compose_refuses_to_start_without_the_token_and_the_public_url_and_env_example_lists_them() -> None:
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    for service in _apps(_compose()).values():
        env = service["environment"]
        for name in ("AGENT_WORLD_TOKEN", "AGENT_WORLD_PUBLIC_URL"):
            assert re.fullmatch(r"\$\{" + name + r":\?[^}]+\}", env[name]), f"{name} must be required: ${{{name}:?…}}"
            assert name in example and example[name] == "", f".env.example must list {name}, empty"


def test_compose_and_the_nginx_configuration_agree() -> None:
    compose = _compose()
    apps = _apps(compose)
    proxy = compose["services"]["proxy"]
    assert proxy["image"].startswith("nginx:")
    assert "./deploy/nginx.conf:/etc/nginx/conf.d/default.conf:ro" in proxy["volumes"]
    conf = DEPLOY_NGINX.read_text()
    upstreams = upstream_servers(conf)
    assert sorted(host for host, _ in upstreams) == sorted(apps), "one upstream server per app replica"
    for host, port in upstreams:
        assert port == build_parser().parse_args((apps[host].get("command") or _image_command())[1:]).port
    published = [p.split(":") for p in proxy["ports"]]
    assert [int(inner) for *_, inner in published] == [listen_port(conf)]
    assert all(condition["condition"] == "service_healthy" for condition in proxy["depends_on"].values())
    assert set(proxy["depends_on"]) == set(apps)
    # The replicas believe X-Forwarded-* from the proxy's fixed address, and from nobody else.
    proxy_ip = proxy["networks"]["backend"]["ipv4_address"]
    assert {s["environment"]["FORWARDED_ALLOW_IPS"] for s in apps.values()} == {proxy_ip}
    for directive in ("proxy_http_version 1.1;", "proxy_set_header Upgrade $http_upgrade;",
                      "proxy_set_header Connection $connection_upgrade;", "proxy_read_timeout 1h;",
                      "proxy_set_header X-Forwarded-Proto $scheme;", "proxy_set_header Host $http_host;"):
        assert directive in conf, directive
    assert re.search(r"map \$http_upgrade \$connection_upgrade \{\s*default upgrade;", conf)
    directives = re.sub(r"#.*", "", conf)
    assert not re.search(r"\b(ip_hash|hash|sticky)\b", directives)  # no sticky sessions


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
    installed = re.search(r"apt-get install ([^&]+)", dockerfile.replace("\\\n", " "))
    assert installed is not None
    assert {"bubblewrap", "slirp4netns", "iproute2"} <= set(installed.group(1).split()), installed.group(1)


def test_the_listed_packages_are_every_package_of_the_source_tree() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("agent_world_client", "server", "web")
             for p in (ROOT / top).rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | set(setuptools["package-dir"])
    assert setuptools["package-dir"] == {"web.templates": "templates", "web.static": "static"}


def test_a_wheel_carries_the_templates_and_static_files_and_renders_from_them(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building leaves build/ and *.egg-info behind
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("agent_world_client", "server", "web", "templates", "static"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(tmp_path)],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stderr
    wheel = next(tmp_path.glob("agent_world-*.whl"))
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    for file in [*(ROOT / "templates").iterdir(), *(ROOT / "static").iterdir()]:
        assert (installed / "web" / file.parent.name / file.name).read_bytes() == file.read_bytes()
    probe = ("import web.render as r; print(r.__file__); print(r.STATIC / 'htmx.min.js'); "
             "print(r.render('signin.html', message='hello from the wheel'))")
    shown = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(installed)}, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    module, htmx, page = shown.stdout.split("\n", 2)
    assert Path(module).is_relative_to(installed) and Path(htmx).is_relative_to(installed) and Path(htmx).is_file()
    assert "hello from the wheel" in page


def test_the_image_build_context_is_enough_for_pip_install(tmp_path: Path) -> None:
    """`RUN pip install .` sees only what the Dockerfile's COPY lines put in /app: every package
    pyproject.toml lists must be among them, or `docker compose up --build` fails."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    app = tmp_path / "app"
    app.mkdir()
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.M):
        *sources, target = shlex.split(line)
        for source in sources:
            origin = ROOT / source
            into_folder = len(sources) > 1 or target.endswith("/")
            into = app / target / origin.name if into_folder else app / target
            if origin.is_dir():
                shutil.copytree(origin, into, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(origin, into)
    # The versions CI tested, as ./dev installs them (the image took whatever was newest before).
    assert re.search(r"^RUN pip install .*-c constraints\.txt \.", dockerfile, re.M)
    assert (app / "constraints.txt").read_text() == (ROOT / "constraints.txt").read_text()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(app),
                            "-w", str(tmp_path / "wheel")],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stderr[-2000:]
