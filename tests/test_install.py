"""Installing only what a role needs (pyproject.toml's extras): `pip install farm` is a submitting client, and it
submits, waits, follows, cancels and downloads on a real farm without numpy, llvmlite, pyopencl, onnx or celery.

A client install is emulated in this fully installed environment: the farm command runs in a fresh process that
finds none of the packages a client install lacks (every installed distribution outside what pyproject.toml's
dependencies bring, as pip resolved them here), and reports which of them it tried to import.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from farm.artifact import verify
from farm.backends.llvm.target import NO_HOST_CPU, host_target
from farm.errors import EXTRA_OF_PACKAGE
from farm.tools import examples
from tests.farm_services import farm_factory_fixture  # noqa: F401
from tests.services import RedisServer, redis_server_fixture  # noqa: F401

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {
    "numpy": "numpy",
    "ml-dtypes": "ml_dtypes",
    "onnx": "onnx",
    "llvmlite": "llvmlite",
    "pyopencl": "pyopencl",
    "celery": "celery",
    "kombu": "kombu",
    "flower": "flower",
}
"""What a client install leaves out, by distribution: its top-level module."""
WORKER = {"numpy", "ml-dtypes", "onnx", "llvmlite", "celery", "cryptography"}
"""What building, running and serving a farm's CPU queues need (farm[worker])."""

CLIENT_PRELUDE = """
import atexit, importlib.abc, json, os, sys

hidden, tried = set(json.loads(os.environ["FARM_TEST_HIDDEN_MODULES"])), set()


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in hidden:
            tried.add(top)
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
        return None


sys.meta_path.insert(0, NotInstalled())
atexit.register(lambda: print("tried to import: " + json.dumps(sorted(tried)), file=sys.stderr))
from farm.cli.main import main

main(prog_name="farm")
"""
"""`farm ARGS` as a client install runs it: `python -c CLIENT_PRELUDE ARGS`."""


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """What `pip install farm[EXTRAS]` asks for: the dependencies and each extra's, farm[...] in an extra expanded."""
    project = _pyproject()["project"]
    wanted = [Requirement(text) for text in project["dependencies"]]
    for extra in extras:
        for requirement in map(Requirement, project["optional-dependencies"][extra]):
            is_farm = canonicalize_name(requirement.name) == "farm"
            wanted += _requirements(tuple(requirement.extras)) if is_farm else [requirement]
    return wanted


def _installed_closure(requirements: list[Requirement]) -> set[str]:
    """The distributions installing `requirements` brings, as pip resolved them here: each with what it requires
    (markers evaluated for this interpreter, no extras of theirs)."""
    todo, found = list(requirements), set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in found or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        todo += map(Requirement, importlib.metadata.requires(name) or [])
    return found


def _hidden_in_a_client_install() -> list[str]:
    """The top-level modules installed here that no distribution of a client install provides."""
    client = _installed_closure(_requirements()) | {"farm"}
    return sorted(
        module
        for module, distributions in importlib.metadata.packages_distributions().items()
        if not any(canonicalize_name(name) in client for name in distributions)
    )


def client_farm(*args: object, cwd: Path, broker: str | None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `farm ARGS` as a client install would, with FARM_BROKER_URL set to `broker`: its result, and which of
    HEAVY's modules it tried to import (others it may try, such as redis trying cryptography, are left out)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {name: value for name, value in os.environ.items() if name != "FARM_BROKER_URL"}
    env.update(
        {
            "PYTHONPATH": path,
            "FARM_TEST_HIDDEN_MODULES": json.dumps(_hidden_in_a_client_install()),
            **({"FARM_BROKER_URL": broker} if broker else {}),
        }
    )
    result = subprocess.run(
        [sys.executable, "-c", CLIENT_PRELUDE, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    tried = re.findall(r"^tried to import: (.*)$", result.stderr, re.MULTILINE)
    assert tried, f"no report of the imports tried:\n{result.stderr}"
    return result, set(json.loads(tried[-1])) & set(HEAVY.values())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


def test_a_client_install_brings_no_compiler_driver_numpy_or_celery() -> None:
    client = _installed_closure(_requirements())
    assert {"click", "rich", "redis"} <= client and not client & set(HEAVY), sorted(client)
    assert not set(HEAVY.values()) - set(_hidden_in_a_client_install())  # the emulation below hides them all


def test_each_role_has_an_extra_with_what_it_runs_and_all_has_every_one() -> None:
    extras = _pyproject()["project"]["optional-dependencies"]
    closure = {extra: _installed_closure(_requirements((extra,))) for extra in extras}
    assert WORKER <= closure["worker"] and not {"pyopencl", "flower"} & closure["worker"]
    assert closure["opencl"] - closure["worker"] >= {"pyopencl"} and closure["worker"] <= closure["opencl"]
    assert closure["flower"] - closure["worker"] >= {"flower"} and closure["worker"] <= closure["flower"]
    assert closure["all"] == closure["opencl"] | closure["flower"]


def test_the_readme_commands_and_the_image_install_every_extra() -> None:
    """scripts/demo.sh and scripts/test.sh (which .ci/run runs) both set up through scripts/setup.sh."""
    assert re.search(
        r"pip install --disable-pip-version-check -e '\.\[all,test\]'", (ROOT / "scripts" / "setup.sh").read_text()
    )
    for script in ("demo.sh", "test.sh"):
        assert "bash scripts/setup.sh" in (ROOT / "scripts" / script).read_text(), script
    test_script = (ROOT / "scripts" / "test.sh").read_text()
    assert test_script.index("bash scripts/lint.sh") < test_script.index("-m pytest"), "lint runs before the tests"
    assert re.search(r"pip install \"\.\[all\]\"", (ROOT / "deploy" / "Dockerfile").read_text())


def test_pip_installs_only_farm_and_celery_finds_the_installed_app_anywhere(tmp_path: Path) -> None:
    """Top-level `tasks` and `workers` packages in site-packages would collide with any other project's: they stay
    files the checkout runs (`celery -A tasks.app` from its root), and `celery -A farm.distributed.tasks` is the
    installed entry point, found from any folder."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == ["farm*"], found
    script = "from celery.app.utils import find_app; print(find_app('farm.distributed.tasks').main)"
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "farm", result.stderr


def test_a_missing_package_names_the_extra_that_brings_it() -> None:
    """What a command on a client install says it lacks (farm.errors.MissingPackageError)."""
    client = _installed_closure(_requirements())
    distributions = importlib.metadata.packages_distributions()
    for module, extra in EXTRA_OF_PACKAGE.items():
        names = {canonicalize_name(name) for name in distributions[module]}
        assert names & _installed_closure(_requirements((extra,))) and not names & client, (module, extra)
    assert set(HEAVY.values()) <= set(EXTRA_OF_PACKAGE)


def _third_party_imports(folder: Path) -> set[str]:
    """The top-level modules the Python files under `folder` import, less the standard library and farm's own."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names) - {"farm", "tasks", "workers"}


def test_every_package_farm_imports_comes_with_farm_all() -> None:
    everything = _installed_closure(_requirements(("all",)))
    distributions = importlib.metadata.packages_distributions()
    imported = set().union(*(_third_party_imports(ROOT / folder) for folder in ("farm", "tasks", "workers")))
    undeclared = {
        module
        for module in imported
        if not any(canonicalize_name(name) in everything for name in distributions.get(module, []))
    }
    assert imported and not undeclared, f"imported but not brought by farm[all]: {sorted(undeclared)}"


def test_a_client_install_builds_waits_and_downloads_on_a_real_farm(farm_factory, model: Path, tmp_path: Path) -> None:
    farm = farm_factory(workers=1)
    target = f"cpu:{host_target().triple}"
    built, tried = client_farm("submit", model, "--target", target, "-o", tmp_path / "a", cwd=tmp_path, broker=farm.url)
    assert built.returncode == 0, built.stderr + farm.logs()
    assert tried <= {"llvmlite", "numpy"}  # it would check the target with LLVM (the workers do), and pack the
    # artifact's packed weights with numpy's packing (the farm keeps none): without either, it packs them itself
    artifact = Path(built.stdout.strip())
    assert artifact == tmp_path / "a" / "tiny_cnn.farm"
    assert [t["triple"] for t in verify(artifact).manifest["targets"]] == [host_target().triple]

    submitted, tried = client_farm(
        "submit", model, "--target", target, "--no-wait", "--json", cwd=tmp_path, broker=farm.url
    )
    assert submitted.returncode == 0 and tried <= {"llvmlite"}, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    for args, check in [
        (("wait", job_id), lambda out: out == f"{job_id}: done"),
        (("status", job_id, "--json"), lambda out: json.loads(out)["state"] == "done"),
        (("download", job_id, "-o", tmp_path / "b"), lambda out: Path(out).read_bytes() == artifact.read_bytes()),
        (("jobs", "--json"), lambda out: job_id in [job["job_id"] for job in json.loads(out)["jobs"]]),
        (("workers", "--json"), lambda out: [worker["name"] for worker in json.loads(out)["workers"]] == ["w1-1@test"]),
    ]:
        result, tried = client_farm(*args, cwd=tmp_path, broker=farm.url)
        assert result.returncode == 0 and check(result.stdout.strip()), (args, result.stdout, result.stderr)
        assert tried <= ({"numpy"} if args[0] == "download" else set()), (args, tried)

    bogus, _ = client_farm(
        "submit", model, "--target", f"{target}:bogus-cpu", "-o", tmp_path / "c", cwd=tmp_path, broker=farm.url
    )
    assert bogus.returncode == 2 and "'bogus-cpu' is not a recognized processor" in bogus.stderr, bogus.stderr


def test_a_client_install_follows_and_cancels_a_job_with_no_worker(
    redis_server: RedisServer, model: Path, tmp_path: Path
) -> None:
    submitted, _ = client_farm(
        "submit",
        model,
        "--target",
        "cpu:aarch64-linux-gnu",
        "--no-wait",
        "--json",
        cwd=tmp_path,
        broker=redis_server.url,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    for args, status, out in [
        (("status", job_id, "--json"), 0, '"no_live_worker": ["control", "llvm"]'),
        (("wait", job_id, "--timeout", "0.5"), 6, ""),
        (("cancel", job_id), 0, f"{job_id}: cancelled"),
        (("status", job_id), 0, f"{job_id}: cancelled"),
        (("store", "stats"), 0, "entries"),
    ]:
        result, tried = client_farm(*args, cwd=tmp_path, broker=redis_server.url)
        assert result.returncode == status and out in result.stdout, (args, result.stdout, result.stderr)
        assert not tried, (args, tried)


def test_a_client_install_asks_for_the_targets_it_cannot_detect(
    redis_server: RedisServer, model: Path, tmp_path: Path
) -> None:
    result, tried = client_farm("submit", model, cwd=tmp_path, broker=redis_server.url)
    assert result.returncode == 2 and f"farm: error: {NO_HOST_CPU}" in result.stderr, result.stderr
    assert tried == {"llvmlite"} and not redis_server.client().keys("farm:*")  # nothing staged, nothing submitted


@pytest.mark.parametrize(
    "args",
    [("inspect", "model.farm"), ("run", "model.farm"), ("submit", "tiny_cnn.onnx", "--target", "cpu:x86_64-linux-gnu")],
)
def test_a_client_install_says_which_extra_a_command_needs(args: tuple[str, ...], model: Path) -> None:
    result, _ = client_farm(*args, cwd=model.parent, broker=None)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 2 and "pip install 'farm[worker]'" in lines[0], result.stderr
