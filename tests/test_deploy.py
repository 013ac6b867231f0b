"""The deployment files: docker-compose.yml, deploy/Dockerfile and deploy/redis.conf, and the ACL file that
docker-compose.yml's redis-acl writes (`farm acl`), loaded with deploy/redis.conf by a real redis-server.

The compose file is read with PyYAML when it is importable and otherwise with `_mini_yaml` below, a small strict
reader of the YAML subset compose files use (block mappings and sequences, quoted and plain scalars, one-line
flow sequences, anchors, aliases and `<<` merges): PyYAML is not one of farm's dependencies, and these checks must
run (not skip) everywhere. Where PyYAML is importable the two readers are also checked to agree.

`docker compose config -q` is run where `docker compose` (or the older `docker-compose`) works; elsewhere that one
check is left out with a note (it is not skipped: under CI a skip counts as a failure).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from farm.distributed import acl, redis_keys, task_messages
from tests.farm_services import farm_cli
from tests.services import RedisServer, free_port, redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
REDIS_CONF = ROOT / "deploy" / "redis.conf"
BLOB_REDIS_CONF = ROOT / "deploy" / "redis-blobs.conf"

FARM_SERVICES = ("flower", "worker-cpu", "worker-opencl")
ACL_SERVICE, ACL_VOLUME = "redis-acl", "redis-acl"
ROLE_PASSWORDS = {role: spec.password_variable for role, spec in acl.ROLES.items()}
SECRET_VARIABLES = (*ROLE_PASSWORDS.values(), "FLOWER_PASSWORD")
PASSWORDS = {variable: f"{variable.lower()}-0123456789abcdef" for variable in SECRET_VARIABLES}
"""The values of the compose file's password variables in the tests that run compose or start its processes."""

try:
    import yaml
except ImportError:  # not a farm dependency: fall back to _mini_yaml
    yaml = None


# --- a small, strict YAML reader ---------------------------------------------------------------------------------


class MiniYamlError(ValueError):
    pass


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (i == 0 or line[i - 1] in " \t[,:-"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    parts, quote, start = [], None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == sep:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _key_split(text: str) -> tuple[str, str] | None:
    """'key: value' -> (key, value); None when the text is not a mapping entry."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and i == 0:
            quote = ch
        elif ch == ":" and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i].strip(), text[i + 1 :].strip()
    return None


def _scalar(text: str) -> Any:
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise MiniYamlError(f"unterminated double-quoted scalar: {text}")
        return json.loads(text)
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise MiniYamlError(f"unterminated single-quoted scalar: {text}")
        return text[1:-1].replace("''", "'")
    if text[:1] in ("|", ">", "{", "!", "?", "%", "@", "`"):
        if text == "{}":
            return {}
        raise MiniYamlError(f"unsupported YAML (block scalar, flow mapping, tag or reserved character): {text}")
    if text in ("null", "Null", "NULL", "~", ""):
        return None
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):  # YAML 1.1, as PyYAML reads it
        return True
    if lowered in ("false", "no", "off"):
        return False
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", text):
        return float(text)
    return text


def _mini_yaml(text: str) -> Any:
    lines: list[tuple[int, str, int]] = []  # (indent, content, line number)
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise MiniYamlError(f"line {number}: tab in indentation")
        content = _strip_comment(raw)
        if not content.strip():
            continue
        if content.strip() in ("---", "..."):
            raise MiniYamlError(f"line {number}: multiple documents are not supported")
        lines.append((len(content) - len(content.lstrip(" ")), content.strip(), number))
    anchors: dict[str, Any] = {}

    def value(text: str, i: int, indent: int, number: int) -> tuple[Any, int]:
        """The value written after 'key:' or '- ' on line i-1; nested blocks start at line i."""
        anchor = None
        if text.startswith("&"):
            anchor, _, text = text.partition(" ")
            anchor, text = anchor[1:], text.strip()
        if text.startswith("*"):
            if text[1:] not in anchors:
                raise MiniYamlError(f"line {number}: unknown alias {text}")
            result = anchors[text[1:]]
        elif text:
            if text.startswith("["):
                if not text.endswith("]"):
                    raise MiniYamlError(f"line {number}: multi-line flow sequences are not supported")
                inner = text[1:-1].strip()
                result = [_scalar(item.strip()) for item in _split_outside_quotes(inner, ",")] if inner else []
            else:
                result = _scalar(text)
        elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("- "))):
            result, i = block(i, lines[i][0])
        else:
            result = None
        if anchor:
            anchors[anchor] = result
        return result, i

    def block(i: int, indent: int) -> tuple[Any, int]:
        if lines[i][1] == "-" or lines[i][1].startswith("- "):
            items = []
            while i < len(lines) and lines[i][0] == indent and (lines[i][1] == "-" or lines[i][1].startswith("- ")):
                _, content, number = lines[i]
                item = content[1:].strip()
                if _key_split(item) is not None and not item.startswith(("'", '"', "[")):
                    raise MiniYamlError(f"line {number}: mappings inside sequence items are not supported")
                result, i = value(item, i + 1, indent, number)
                items.append(result)
            if i < len(lines) and lines[i][0] > indent:
                raise MiniYamlError(f"line {lines[i][2]}: unexpected indentation")
            return items, i
        mapping: dict[Any, Any] = {}
        merges: list[dict] = []
        while i < len(lines) and lines[i][0] == indent:
            _, content, number = lines[i]
            split = _key_split(content)
            if split is None:
                raise MiniYamlError(f"line {number}: expected 'key: value', got {content!r}")
            key, rest = split
            key = _scalar(key) if key[:1] in "\"'" else key
            result, i = value(rest, i + 1, indent, number)
            if key == "<<":
                for merged in result if isinstance(result, list) else [result]:
                    if not isinstance(merged, dict):
                        raise MiniYamlError(f"line {number}: '<<' needs a mapping")
                    merges.append(merged)
                continue
            if key in mapping:
                raise MiniYamlError(f"line {number}: duplicate key {key!r}")
            mapping[key] = result
        if i < len(lines) and lines[i][0] > indent:
            raise MiniYamlError(f"line {lines[i][2]}: unexpected indentation")
        for merged in merges:  # explicit keys win over merged ones, earlier merges over later ones
            for key, item in merged.items():
                mapping.setdefault(key, item)
        return mapping, i

    if not lines:
        return None
    result, i = block(0, lines[0][0])
    if i != len(lines):
        raise MiniYamlError(f"line {lines[i][2]}: unexpected dedent or content")
    return result


# --- helpers -------------------------------------------------------------------------------------------------------


def _compose() -> dict:
    text = COMPOSE.read_text()
    data = yaml.safe_load(text) if yaml is not None else _mini_yaml(text)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), "docker-compose.yml has no services"
    return data


def _service(name: str) -> dict:
    services = _compose()["services"]
    assert name in services, f"docker-compose.yml has no service {name!r} (has {sorted(services)})"
    return services[name]


def _tokens(command: Any) -> list[str]:
    """A compose command (exec-form list or shell-form string) as a list of words."""
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list), f"command is neither a string nor a list: {command!r}"
    return [str(word) for word in command]


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if item is None else str(item) for key, item in env.items()}


def _secret_references(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The paths (keys and list indexes) of the compose file's strings that read a password variable."""
    if isinstance(node, dict):
        for key, item in node.items():
            yield from _secret_references(item, (*path, str(key)))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _secret_references(item, (*path, str(index)))
    elif isinstance(node, str) and any(f"${{{variable}" in node for variable in SECRET_VARIABLES):
        yield path


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends with a continuation line"
    return instructions


# --- the tests -----------------------------------------------------------------------------------------------------


def test_mini_yaml_reads_the_compose_subset():
    text = """\
# a comment
x-base: &base
  image: farm:latest   # trailing comment
  environment: &env
    URL: "redis://:${PW:?set PW}@redis:6379/0"
  n: 3
services:
  one:
    <<: *base
    command: ["celery", "-A", 'tasks.app', "a # not a comment"]
    ports:
      - "5555:5555"
  two:
    <<: *base
    image: other
    environment:
      <<: *env
      EXTRA: /etc/x
    list:
    - a
    - yes
    empty:
volumes:
  data:
"""
    base = {"image": "farm:latest", "environment": {"URL": "redis://:${PW:?set PW}@redis:6379/0"}, "n": 3}
    expected = {
        "x-base": base,
        "services": {
            "one": {**base, "command": ["celery", "-A", "tasks.app", "a # not a comment"], "ports": ["5555:5555"]},
            "two": {
                **base,
                "image": "other",
                "environment": {"URL": "redis://:${PW:?set PW}@redis:6379/0", "EXTRA": "/etc/x"},
                "list": ["a", True],
                "empty": None,
            },
        },
        "volumes": {"data": None},
    }
    assert _mini_yaml(text) == expected
    for bad in ("a: |\n  text\n", "a:\n  - b: c\n", "a: *nowhere\n", "a: 1\na: 2\n", "a: [1,\n  2]\n"):
        try:
            _mini_yaml(bad)
        except MiniYamlError:
            continue
        raise AssertionError(f"_mini_yaml accepted unsupported or invalid YAML: {bad!r}")
    if yaml is not None:
        assert _mini_yaml(text) == yaml.safe_load(text)
        assert _mini_yaml(COMPOSE.read_text()) == yaml.safe_load(COMPOSE.read_text())
    else:
        print("note: PyYAML is not importable here; docker-compose.yml is read with _mini_yaml only")


def test_compose_has_the_farm_services_and_the_x_farm_anchor():
    data = _compose()
    assert {"redis", *FARM_SERVICES} <= set(data["services"])
    assert "x-farm" in data, "the shared farm service settings live under the x-farm extension key"
    text = COMPOSE.read_text()
    assert re.search(r"^x-farm:\s*&farm\b", text, re.MULTILINE), "x-farm must define the &farm anchor"
    for name in FARM_SERVICES:
        block = re.search(rf"^  {re.escape(name)}:\n((?:    .*\n|\s*\n)*)", text, re.MULTILINE)
        assert block and re.search(r"^    <<: \*farm\s*$", block.group(1), re.MULTILINE), f"{name} must merge *farm"


def test_redis_loads_the_acl_file_keeps_appendonly_a_volume_and_a_healthcheck():
    data = _compose()
    redis = data["services"]["redis"]
    assert str(redis["image"]).startswith("redis:7"), redis["image"]
    words = _tokens(redis["command"])
    assert words[0] == "redis-server", words
    assert "--requirepass" not in words, f"the password must not be on redis's command line: {words}"
    assert "--aclfile" in words and words[words.index("--aclfile") + 1] == "/acl/users.acl", words
    assert "--appendonly" in words and words[words.index("--appendonly") + 1] == "yes", words
    volumes = [str(volume) for volume in redis.get("volumes") or []]
    data_volume = [volume for volume in volumes if volume.split(":")[1:2] == ["/data"]]
    assert data_volume, f"redis must keep /data in a volume: {volumes}"
    named = data_volume[0].split(":")[0]
    assert not named.startswith((".", "/")) and named in (data.get("volumes") or {}), (
        f"/data must be a named volume: {named}"
    )
    assert f"{ACL_VOLUME}:/acl:ro" in volumes, f"redis must mount the ACL volume read-only at /acl: {volumes}"
    for volume in volumes:  # bind-mounted files (deploy/redis.conf) must exist
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (ROOT / source).exists(), f"redis mounts {source}, which does not exist"
    assert redis["depends_on"][ACL_SERVICE]["condition"] == "service_completed_successfully", redis["depends_on"]
    health = " ".join(_tokens(redis["healthcheck"]["test"]))
    assert "redis-cli --user farm-submitter ping" in health and "PONG" in health, health
    assert _environment(redis).get("REDISCLI_AUTH", "").startswith("${FARM_SUBMITTER_PASSWORD:?"), (
        "the healthcheck logs in as farm-submitter with the password in REDISCLI_AUTH, never in argv"
    )


def test_the_acl_service_writes_the_file_once_from_the_environment():
    data = _compose()
    service = _service(ACL_SERVICE)
    assert _tokens(service["command"]) == ["farm", "acl", "-o", "/etc/farm/acl/users.acl"], service["command"]
    assert service["image"] == data["x-farm"]["image"] and service["build"] == data["x-farm"]["build"], service
    assert service["restart"] == "no", "redis-acl is one-shot: restarting it would loop"
    assert "depends_on" not in service, "redis-acl runs before redis, so it can't wait for it"
    env = _environment(service)
    for variable in ROLE_PASSWORDS.values():
        assert env.get(variable, "").startswith(f"${{{variable}:?"), f"redis-acl must require {variable}: {env}"
    assert [str(volume) for volume in service["volumes"]] == [f"{ACL_VOLUME}:/etc/farm/acl"], service["volumes"]
    assert ACL_VOLUME in (data.get("volumes") or {}), f"{ACL_VOLUME} must be a named volume"
    # The image's folder belongs to farm, so the new volume mounted there does, and `farm acl` (as farm) can write.
    assert any(
        kind == "RUN" and re.search(r"install -d -o farm -g farm -m 0755 /etc/farm/acl(\s|$)", args)
        for kind, args in _dockerfile()
    ), "the Dockerfile must make /etc/farm/acl farm's"


def test_no_secret_is_on_any_command_line():
    """Every password variable is read only into an `environment` value: never into a command, an entrypoint or a
    healthcheck, whose words every user of the host can read (ps, /proc, docker inspect)."""
    data = _compose()
    for name, service in data["services"].items():
        for field in ("command", "entrypoint"):
            if field in service:
                assert "$" not in " ".join(_tokens(service[field])), f"{name}: no variable in its {field}"
        if "healthcheck" in service:
            assert "$" not in " ".join(_tokens(service["healthcheck"]["test"])), f"{name}: healthcheck"
    places = list(_secret_references(data))
    assert places, "no password variable found in docker-compose.yml"
    for path in places:
        assert len(path) >= 2 and path[-2] == "environment", f"a password variable is read at {'.'.join(path)}"


def _redis_settings(conf: Path) -> dict[str, str]:
    settings: dict[str, str] = {}
    for raw in conf.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, rest = line.partition(" ")
            settings[key.lower()] = rest.strip().strip('"')
    return settings


def test_redis_conf_is_durable_and_holds_no_password():
    settings = _redis_settings(REDIS_CONF)
    assert settings.get("appendonly") == "yes", settings
    assert settings.get("appendfsync") == "everysec", settings
    assert settings.get("save") == "", "no RDB snapshots: each rewrote the whole cache, and held a stop for a minute"
    assert "requirepass" not in settings and "user" not in settings, "redis.conf holds no password and no user"
    assert "aclfile" not in settings, "the ACL file is named by whoever starts redis (docker-compose.yml: --aclfile)"


def _bytes(text: str) -> int:
    """A Redis memory setting (`3gb`, `512mb`) in bytes."""
    units = {"gb": 1 << 30, "mb": 1 << 20, "kb": 1 << 10}
    unit = text[-2:].lower()
    return int(text[:-2]) * units[unit] if unit in units else int(text)


def test_both_redis_have_a_maxmemory_above_the_store_cap_and_the_durable_one_never_evicts():
    """Issue 30: redis.conf set no maxmemory, so staged uploads could grow Redis until the host killed it. Both
    servers have one, with room above the store's default cap; the durable one refuses writes past it (an evicted
    queue entry would be a lost task), the blob Redis drops least recently used bytes (rebuilt)."""
    from farm import defaults

    durable, blobs = _redis_settings(REDIS_CONF), _redis_settings(BLOB_REDIS_CONF)
    for settings in (durable, blobs):
        assert _bytes(settings["maxmemory"]) >= 1.25 * defaults.STORE_MAX_BYTES, settings
    assert durable["maxmemory-policy"] == "noeviction" and blobs["maxmemory-policy"] == "allkeys-lru"


def test_the_blob_redis_writes_nothing_to_disk_and_holds_no_password():
    """deploy/redis-blobs.conf: the store's bytes are a cache, so no append-only file and no snapshot ever
    rewrites them (the durable Redis keeps what must survive)."""
    settings = _redis_settings(BLOB_REDIS_CONF)
    assert settings.get("appendonly") == "no" and settings.get("save") == "", settings
    assert "requirepass" not in settings and "user" not in settings and "aclfile" not in settings, settings


def test_compose_runs_the_blob_redis_with_the_same_users_and_the_workers_keep_their_bytes_there():
    data = _compose()
    blobs = _service("redis-blobs")
    words = _tokens(blobs["command"])
    assert words[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"], words
    assert words[words.index("--aclfile") + 1] == "/acl/users.acl" and "--appendonly" not in words, words
    volumes = [str(volume) for volume in blobs.get("volumes") or []]
    assert "./deploy/redis-blobs.conf:/usr/local/etc/redis/redis.conf:ro" in volumes, volumes
    assert f"{ACL_VOLUME}:/acl:ro" in volumes and not any(":/data" in volume for volume in volumes), volumes
    assert blobs["depends_on"][ACL_SERVICE]["condition"] == "service_completed_successfully", blobs["depends_on"]
    assert "redis-cli --user farm-submitter ping" in " ".join(_tokens(blobs["healthcheck"]["test"]))
    env = _environment(data["x-farm"])
    worker = acl.ROLES["worker"]
    assert re.fullmatch(
        rf"redis://{worker.user}:\$\{{{worker.password_variable}:\?[^}}]*\}}@redis-blobs:6379/0", env["FARM_BLOB_STORE"]
    ), env["FARM_BLOB_STORE"]
    assert "@" not in env["FARM_BLOB_STORE_CLIENT_URL"], "clients log in with their own user, never the workers'"
    for name in FARM_SERVICES:
        assert _service(name)["depends_on"]["redis-blobs"]["condition"] == "service_healthy", name


def test_flower_takes_its_basic_auth_from_the_environment_and_listens_on_5555():
    flower = _service("flower")
    words = _tokens(flower["command"])
    assert words[:4] == ["celery", "-A", "farm.distributed.tasks", "flower"], words
    assert not any(word.startswith("--basic-auth") for word in words), f"Flower's password must not be in argv: {words}"
    auth = _environment(flower).get("FLOWER_BASIC_AUTH", "")  # Flower reads FLOWER_<option>: user:password
    assert re.fullmatch(r"\$\{FLOWER_USER(:-[^}]*)?\}:\$\{FLOWER_PASSWORD:\?[^}]*\}", auth), (
        f"FLOWER_BASIC_AUTH must be ${{FLOWER_USER}}:${{FLOWER_PASSWORD}}, the password required: {auth!r}"
    )
    assert "--port=5555" in words, words
    assert any(str(port).endswith(":5555") for port in flower.get("ports") or []), flower.get("ports")
    assert flower["depends_on"]["redis"]["condition"] == "service_healthy", flower["depends_on"]
    assert [_mounted_source(flower, word) for word in words if word.startswith("--conf=")] == [
        ROOT / "deploy" / "flowerconfig.py"
    ], f"Flower must run deploy/flowerconfig.py (/metrics behind its login): {words}"


def _mounted_source(service: dict, option: str) -> Path:
    """The file of this checkout that `option` (--conf=PATH) names inside the service's container: the source of
    the bind mount (`./deploy/x:/etc/farm/x:ro`) whose target PATH is."""
    target = option.partition("=")[2]
    for volume in service.get("volumes") or []:
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == target and source.startswith("./"):
            return ROOT / source[2:]
    raise AssertionError(f"{option}: no volume of the service mounts a file of the checkout at {target}")


def test_workers_run_farm_worker_and_worker_cpu_scales():
    cpu, opencl = _service("worker-cpu"), _service("worker-opencl")
    for name, service in (("worker-cpu", cpu), ("worker-opencl", opencl)):
        words = _tokens(service.get("command", ["farm", "worker"]))  # no command: the image's CMD, farm worker
        assert words[:2] == ["farm", "worker"], f"{name}: {words}"
    assert "container_name" not in cpu, "worker-cpu must have no container_name, so --scale worker-cpu=N works"
    assert not cpu.get("ports"), "worker-cpu must publish no host ports, so --scale worker-cpu=N works"
    assert "OCL_ICD_VENDORS" not in _environment(opencl), "worker-opencl must see PoCL"
    hidden = _environment(cpu).get("OCL_ICD_VENDORS")
    if hidden:  # the folder that hides OpenCL must be made in the image
        assert any(kind == "RUN" and hidden in args for kind, args in _dockerfile()), (
            f"the Dockerfile never creates {hidden}"
        )


def test_every_farm_service_logs_in_as_its_role_and_runs_the_farm_image():
    for name in FARM_SERVICES:
        service = _service(name)
        role = acl.ROLES["flower" if name == "flower" else "worker"]
        url = _environment(service).get("FARM_BROKER_URL", "")
        expected = rf"redis://{re.escape(role.user)}:\$\{{{role.password_variable}:\?[^}}]*\}}@redis:6379/0"
        assert re.fullmatch(expected, url), (
            f"{name}: FARM_BROKER_URL must be redis://{role.user}:${{{role.password_variable}}}@redis:6379/0, "
            f"is {url!r}"
        )
        build = service.get("build")
        assert isinstance(build, dict) and build.get("dockerfile") == "deploy/Dockerfile", f"{name}: build {build!r}"
        assert build.get("context") in (".", "./"), f"{name}: build context {build.get('context')!r}"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", f"{name}: {service['depends_on']}"


def test_dockerfile_installs_pocl_and_lld_and_runs_as_farm():
    instructions = _dockerfile()
    kinds = [kind for kind, _ in instructions]
    assert instructions[kinds.index("FROM")][1].split()[0] == "python:3.11-slim-bookworm", instructions[0]
    installs = " ".join(args for kind, args in instructions if kind == "RUN" and "apt-get install" in args)
    for package in ("pocl-opencl-icd", "ocl-icd-libopencl1", "clinfo", "lld", "binutils"):
        assert re.search(rf"(?<![\w.-]){re.escape(package)}(?![\w.-])", installs), (
            f"the Dockerfile must apt-get install {package}"
        )
    assert any(
        kind == "RUN" and re.search(r"pip install (.* )?(\"\.\[all\]\"|'\.\[all\]')(\s|$)", args)
        for kind, args in instructions
    ), 'pip install ".[all]": the image serves every role (worker, OpenCL, Flower)'
    for kind, args in instructions:
        if kind == "COPY":
            sources = [word for word in args.split() if not word.startswith("--")][:-1]
            for source in sources:
                assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"
    users = [args.split()[0] for kind, args in instructions if kind == "USER"]
    assert users, "the Dockerfile must switch to a non-root USER"
    assert users[-1].split(":")[0] not in ("root", "0"), f"the image must run as non-root, runs as {users[-1]}"
    assert users[-1].split(":")[0] == "farm", users
    assert any(kind == "RUN" and "useradd" in args and re.search(r"\bfarm\b", args) for kind, args in instructions)
    cmd = [args for kind, args in instructions if kind == "CMD"]
    assert cmd and _tokens(json.loads(cmd[-1]) if cmd[-1].startswith("[") else cmd[-1]) == ["farm", "worker"], cmd


def _compose_command() -> list[str] | None:
    """`docker compose`, else the older `docker-compose`, where one works (neither needs the daemon for config)."""
    docker = shutil.which("docker")
    candidates = ([[docker, "compose"]] if docker else []) + [
        [found] for found in [shutil.which("docker-compose")] if found
    ]
    for candidate in candidates:
        version = subprocess.run([*candidate, "version"], capture_output=True, text=True, timeout=60)
        if version.returncode == 0:
            return candidate
    return None


def test_docker_compose_config_accepts_the_file_and_requires_every_password():
    compose = _compose_command()
    if compose is None:
        print("note: neither `docker compose` nor `docker-compose` is available here; `config -q` was not run")
        return
    env = {**os.environ, **PASSWORDS}
    command = [*compose, "--project-directory", str(ROOT), "-f", str(COMPOSE), "config", "-q"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    if (ROOT / ".env").exists():  # compose would take the passwords from there
        print("note: a .env file exists; the check that compose refuses to start without the passwords was not run")
        return
    for missing in SECRET_VARIABLES:
        without = {key: value for key, value in env.items() if key != missing}
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=without, cwd=ROOT)
        assert result.returncode != 0 and re.search(rf"set {missing}\s*$", result.stderr), (
            f"compose must refuse to start without {missing}: {result.stderr}"
        )


class DeployedRedis(RedisServer):
    """redis-server as docker-compose.yml starts it: deploy/redis.conf, then `--aclfile` (on 127.0.0.1 and a free
    port here). The default user is off, so readiness is checked as farm-worker."""

    def __init__(self, aclfile: Path, worker_password: str) -> None:
        super().__init__()
        self.aclfile, self.worker_password = aclfile, worker_password

    @property
    def url(self) -> str:
        return self.url_for(acl.ROLES["worker"].user, self.worker_password)

    def _arguments(self) -> list[str]:
        binary, *options = super()._arguments()
        return [binary, str(REDIS_CONF), *options, "--aclfile", str(self.aclfile)]


@pytest.fixture(name="deployed_redis")
def deployed_redis_fixture(tmp_path: Path) -> Iterator[DeployedRedis]:
    """redis-server with deploy/redis.conf and the ACL file `farm acl` wrote from PASSWORDS in its environment."""
    aclfile = tmp_path / "users.acl"
    written = farm_cli("acl", "-o", str(aclfile), broker="", cwd=tmp_path, env=PASSWORDS)
    assert written.returncode == 0, written.stderr
    with DeployedRedis(aclfile, PASSWORDS[ROLE_PASSWORDS["worker"]]) as server:
        yield server


def test_the_acl_file_farm_acl_writes_is_what_redis_loads(deployed_redis: DeployedRedis):
    assert deployed_redis.aclfile.stat().st_mode & 0o777 == 0o644, "redis-server runs as user redis: it must read it"
    text = deployed_redis.aclfile.read_text()
    assert not any(password in text for password in PASSWORDS.values()), "only the passwords' hashes are stored"
    nobody = redis.Redis(port=deployed_redis.port, socket_timeout=10)
    with pytest.raises(redis.exceptions.AuthenticationError):  # NOAUTH: the default user is off
        nobody.ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        nobody.auth("", "default")
    clients = {}
    for role, spec in acl.ROLES.items():
        clients[role] = redis.Redis.from_url(deployed_redis.url_for(spec.user, PASSWORDS[spec.password_variable]))
        assert clients[role].ping(), f"{spec.user} can't log in"
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(deployed_redis.url_for(spec.user, "wrong")).ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        clients["submitter"].lpush(task_messages.CONTROL_QUEUE, "forged")
    assert clients["submitter"].lpush(redis_keys.SUBMITTED_KEY, "0123456789abcdef") == 1
    assert clients["worker"].lpush(task_messages.CONTROL_QUEUE, "task") == 1
    with pytest.raises(redis.exceptions.NoPermissionError):
        clients["flower"].lpush(task_messages.CONTROL_QUEUE, "forged")
    _run_the_healthcheck(deployed_redis, PASSWORDS[ROLE_PASSWORDS["submitter"]])


def _interpolate(value: str, environ: dict[str, str]) -> str:
    """A compose value with its ${VAR}, ${VAR:-default} and ${VAR:?message} replaced from `environ`."""

    def one(match: re.Match[str]) -> str:
        name, operator, rest = match.group(1), match.group(2), match.group(3)
        if environ.get(name):
            return environ[name]
        assert operator != ":?", f"{name} is required: {rest}"
        return rest if operator == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def test_flower_starts_as_compose_runs_it_and_asks_for_its_login(deployed_redis: DeployedRedis, tmp_path: Path):
    """The flower service's command and environment (its broker URL pointed at this server, its --conf at the
    mounted file of this checkout): Flower logs in to Redis as farm-flower and takes its web login from
    FLOWER_BASIC_AUTH, with nothing secret in its argv, and asks for it on /metrics too."""
    flower = _service("flower")
    env = {name: _interpolate(value, PASSWORDS) for name, value in _environment(flower).items()}
    env["FARM_BROKER_URL"] = env["FARM_BROKER_URL"].replace("@redis:6379/", f"@127.0.0.1:{deployed_redis.port}/")
    port = free_port()
    words = [
        f"--conf={_mounted_source(flower, word)}" if word.startswith("--conf=") else word
        for word in _tokens(flower["command"])
        if not word.startswith("--port=")
    ]
    command = [sys.executable, "-m", *words, f"--port={port}", "--address=127.0.0.1"]
    assert not any(password in " ".join(command) for password in PASSWORDS.values())
    log = tmp_path / "flower.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            start_new_session=True,
        )
    try:
        login = env["FLOWER_BASIC_AUTH"]
        for path in ("/api/workers", "/metrics"):  # /metrics too: deploy/flowerconfig.py
            assert _flower_status(port, login, process, log, path) == 200
            assert _flower_status(port, None, process, log, path) == 401
            assert _flower_status(port, login.split(":")[0] + ":wrong", process, log, path) == 401
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _flower_status(port: int, login: str | None, process: subprocess.Popen, log: Path, path: str) -> int:
    """The HTTP status of Flower's `path` with this basic-auth login (None: none), once Flower answers."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if login is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"flower exited at start:\n{log.read_text(errors='replace')}"
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise AssertionError(f"flower did not answer on port {port}:\n{log.read_text(errors='replace')}")


def _run_the_healthcheck(server: RedisServer, submitter_password: str) -> None:
    """docker-compose.yml's healthcheck of redis, pointed at this server: it passes with the password redis's
    environment gives it, and fails with another."""
    cli = shutil.which("redis-cli")
    if cli is None:
        print("note: redis-cli is not installed here; the compose healthcheck was not run against redis-server")
        return
    kind, test = _service("redis")["healthcheck"]["test"]
    assert kind == "CMD-SHELL", kind
    shell = test.replace("redis-cli", f"{shlex.quote(cli)} -p {server.port}", 1)
    for password, status in ((submitter_password, 0), ("wrong", 1)):
        result = subprocess.run(
            ["sh", "-c", shell],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "REDISCLI_AUTH": password},
        )
        assert result.returncode == status, f"healthcheck with password {password!r}: {result}"


class DeployedBlobRedis(DeployedRedis):
    """redis-server as docker-compose.yml starts the blob Redis: deploy/redis-blobs.conf and `--aclfile`, nothing
    else of the tests' servers' settings (their append-only file)."""

    def _arguments(self) -> list[str]:
        return [
            redis_server_binary(),
            str(BLOB_REDIS_CONF),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--logfile",
            str(self.log_path),
            "--daemonize",
            "no",
            "--aclfile",
            str(self.aclfile),
        ]


@pytest.mark.services
def test_the_blob_redis_takes_the_acl_file_a_submitter_stages_and_reads_never_writes_an_entry(tmp_path: Path):
    aclfile = tmp_path / "users.acl"
    assert farm_cli("acl", "-o", str(aclfile), broker="", cwd=tmp_path, env=PASSWORDS).returncode == 0
    with DeployedBlobRedis(aclfile, PASSWORDS[ROLE_PASSWORDS["worker"]]) as server:
        worker = redis.Redis.from_url(server.url)
        submitter = redis.Redis.from_url(
            server.url_for(acl.ROLES["submitter"].user, PASSWORDS[ROLE_PASSWORDS["submitter"]])
        )
        key = "0" * 64
        assert submitter.set(f"{acl.STORE_PREFIX}staged:{key}:0", b"weights", ex=60)
        worker.set(f"{acl.STORE_PREFIX}obj:{key}:0", b"an entry")
        assert submitter.get(f"{acl.STORE_PREFIX}obj:{key}:0") == b"an entry"
        with pytest.raises(redis.exceptions.NoPermissionError):
            submitter.set(f"{acl.STORE_PREFIX}obj:{key}:0", b"forged")
        assert not (server.folder / "appendonlydir").exists(), "the blob Redis keeps no append-only file"
