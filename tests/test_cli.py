"""The `farm` command end to end, as a user runs it: real processes, real files, documented exit statuses."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.artifact import artifact_bytes
from farm.backends.llvm.target import host_target
from farm.distributed import recipes, redis_keys
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobRecord, JobState
from farm.errors import ExitStatus
from farm.store import FileStore, RedisStore
from farm.tools import examples
from tests.dynamic_models import dynamic_cnn
from tests.farm_services import farm_cli
from tests.numerics import assert_close
from tests.services import RedisServer, _started_servers, redis_server_fixture  # noqa: F401

# The checkout under test first on the path, so that `python -m farm` runs it even where another checkout is the
# installed one.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(examples.__file__))))


def farm(*args, cwd, env=None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "farm", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """tiny_cnn.onnx built once with the CLI, with an input file."""
    folder = tmp_path_factory.mktemp("cli")
    model = examples.tiny_cnn()
    onnx.save(model, folder / "tiny_cnn.onnx")
    np.save(folder / "x.npy", examples.random_input(model)["input"])
    result = farm("submit", "tiny_cnn.onnx", "--json", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder, json.loads(result.stdout)


def _single_op_model(path, op="Relu", shape=(2, 3), **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="the_node", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_submit_json_reports_the_job(built):
    folder, job = built
    assert job["state"] == "done" and job["job_id"] and job["kernels"] > 0 and job["blobs"] > 0
    assert job["seconds"] >= 0
    assert os.path.samefile(job["artifact"], folder / "artifacts" / "tiny_cnn.farm")


def test_submit_prints_the_artifact_path_and_shows_progress(built, tmp_path):
    folder, _ = built
    result = farm("submit", folder / "tiny_cnn.onnx", "-o", tmp_path, cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == str(tmp_path / "tiny_cnn.farm")
    assert "farm: tiny_cnn.onnx: compiling" in result.stderr and "farm: tiny_cnn.onnx: done, " in result.stderr


def test_submit_shape_pins_a_dynamic_dimension_and_bad_or_missing_pins_exit_2_on_one_line(tmp_path):
    """A dynamic model builds with --shape (by dimension name or whole input); without it, or with a pin that is
    malformed or names nothing in the model, submit exits 2 with one line that says what to pass."""
    dynamic_cnn(tmp_path / "dyn.onnx")
    missing = farm("submit", "dyn.onnx", cwd=tmp_path)
    assert missing.returncode == ExitStatus.BAD_INPUT and missing.stderr.count("\n") == 1
    assert "model input 'x' has dynamic shape [batch, 3, 8, 8]; pin it with --shape batch=N" in missing.stderr
    for bad, says in (
        ("batch", "expected NAME=SIZE"),
        ("seq=4", "no input or symbolic dimension"),
        ("batch=1,1", "a size is given twice"),
    ):
        result = farm("submit", "dyn.onnx", "--shape", bad, cwd=tmp_path)
        assert result.returncode == ExitStatus.BAD_INPUT and says in result.stderr
        assert result.stderr.startswith("farm: error: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "artifacts").exists()
    np.save(tmp_path / "x.npy", np.ones((2, 3, 8, 8), np.float32))
    for pin in ("batch=2", "x=2x3x8x8", "batch=1,2"):
        built = farm("submit", "dyn.onnx", "--shape", pin, "--json", "-o", pin, cwd=tmp_path)
        assert built.returncode == 0, built.stderr
        ran = farm("run", json.loads(built.stdout)["artifact"], "--input", "x=x.npy", "-o", "y.npz", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        assert np.load(tmp_path / "y.npz")["y"].shape == (2, 5)


def test_run_writes_outputs_that_match_onnxruntime(built):
    import onnxruntime

    folder, job = built
    result = farm("run", job["artifact"], "--input", "input=x.npy", "-o", "out.npz", "--print", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "output: shape [1, 10]" in result.stdout
    ours = np.load(folder / "out.npz")["output"]
    reference = onnxruntime.InferenceSession(str(folder / "tiny_cnn.onnx")).run(
        None, {"input": np.load(folder / "x.npy")}
    )
    assert np.abs(ours - reference[0]).max() <= 1e-4
    threaded = farm("run", job["artifact"], "--input", "input=x.npy", "-o", "out3.npz", "--threads", "3", cwd=folder)
    assert threaded.returncode == 0, threaded.stderr
    np.testing.assert_array_equal(np.load(folder / "out3.npz")["output"], ours)
    every_cpu = farm("run", job["artifact"], "--input", "input=x.npy", "-o", "out0.npz", "--threads", "0", cwd=folder)
    assert every_cpu.returncode == 0, every_cpu.stderr
    refused = farm("run", job["artifact"], "--input", "input=x.npy", "--threads", "-1", cwd=folder)
    assert refused.returncode == 2 and "--threads" in refused.stderr


@pytest.fixture(scope="module")
def cross_built(built):
    """tiny_cnn built with the CLI for this host, aarch64 and riscv64: (its folder, the artifact)."""
    folder, _ = built
    result = farm(
        "submit",
        "tiny_cnn.onnx",
        "--target",
        "cpu",
        "--target",
        "cpu:aarch64-linux-gnu",
        "--target",
        "cpu:riscv64-linux-gnu",
        "-o",
        "cross/tiny_cnn.farm",
        cwd=folder,
    )
    assert result.returncode == 0, result.stderr
    return folder, result.stdout.strip()


def test_run_a_cross_target_under_qemu_prints_what_a_native_run_prints(cross_built):
    folder, artifact = cross_built
    native = farm(
        "run",
        artifact,
        "--target",
        f"cpu:{host_target().triple}",
        "--input",
        "input=x.npy",
        "-o",
        "native.npz",
        "--json",
        cwd=folder,
    )
    assert native.returncode == 0, native.stderr
    assert json.loads(native.stdout)["emulated"] is False and json.loads(native.stdout)["target"] == host_target().id
    riscv = next(
        target["id"]
        for target in json.loads(farm("inspect", artifact, "--json", cwd=folder).stdout)["targets"]
        if target["id"].startswith("cpu-riscv64")
    )
    for named in ("cpu:aarch64-linux-gnu", riscv):
        ran = farm(
            "run", artifact, "--target", named, "--input", "input=x.npy", "-o", "cross.npz", "--json", cwd=folder
        )
        assert ran.returncode == 0, ran.stderr
        report = json.loads(ran.stdout)
        assert report["emulated"] is True and report["target"].startswith(("cpu-aarch64", "cpu-riscv64"))
        assert_close(np.load(folder / "cross.npz")["output"], np.load(folder / "native.npz")["output"], named)
        printed = farm("run", artifact, "--target", named, "--input", "input=x.npy", cwd=folder)
        assert printed.returncode == 0 and printed.stdout.startswith("output: shape [1, 10] float32 argmax")


def test_a_cross_target_without_qemu_names_the_package_to_install(cross_built, tmp_path):
    folder, artifact = cross_built
    result = farm(
        "run",
        artifact,
        "--target",
        "cpu:aarch64-linux-gnu",
        "--input",
        "input=x.npy",
        cwd=folder,
        env={"PATH": str(tmp_path)},
    )
    _assert_bad_input(result, "qemu-aarch64-static is not installed", "apt-get install qemu-user-static")
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


def test_bench_refuses_an_emulated_target(cross_built):
    folder, artifact = cross_built
    result = farm("bench", artifact, "--target", "cpu:riscv64-linux-gnu", "--repeat", "1", cwd=folder)
    _assert_bad_input(result, "runs only under emulation on this", "says nothing of the target's")
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


def _assert_bad_input(result, *fragments):
    assert result.returncode == 2, (result.stdout, result.stderr)
    for fragment in fragments:
        assert fragment in result.stderr


def test_truncated_model(tmp_path):
    model = examples.tiny_cnn().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(model[: len(model) // 3])
    _assert_bad_input(farm("submit", "cut.onnx", cwd=tmp_path), "cut.onnx")
    assert not (tmp_path / "artifacts" / "cut.farm").exists()


def test_a_file_that_is_not_a_model_is_refused_in_one_line_before_any_build(tmp_path):
    (tmp_path / "notes.onnx").write_text("# not a model\n")
    result = farm("submit", "notes.onnx", cwd=tmp_path)
    _assert_bad_input(result, "can't read ONNX model notes.onnx: not a protobuf message")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "artifacts").exists()


def test_unsupported_op_names_node_op_domain_and_opset(tmp_path):
    _single_op_model(tmp_path / "m.onnx", op="RandomNormalLike")
    result = farm("submit", "m.onnx", "--json", cwd=tmp_path)
    _assert_bad_input(result, "'the_node'", "'RandomNormalLike'", "ai.onnx", "opset 17")
    assert json.loads(result.stdout)["state"] == "failed"
    assert not (tmp_path / "artifacts" / "m.farm").exists()


def test_dynamic_dimension(tmp_path):
    _single_op_model(tmp_path / "m.onnx", shape=("N", 3))
    _assert_bad_input(farm("submit", "m.onnx", cwd=tmp_path), "dynamic")
    assert not (tmp_path / "artifacts" / "m.farm").exists()


def test_declared_output_larger_than_computed_is_refused(tmp_path):
    """A Gemm declaring a [64, 64] output it computes as [2, 4] once built an artifact that read out of bounds."""
    node = helper.make_node("Gemm", ["x", "W"], ["y"], name="gemm", transB=1)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    result = farm("submit", "m.onnx", cwd=tmp_path)
    _assert_bad_input(result, "'gemm'", "'y' is declared with shape [64, 64]", "[2, 4]")
    assert "Traceback" not in result.stderr and not (tmp_path / "artifacts" / "m.farm").exists()


def test_external_data_outside_the_model_folder(tmp_path):
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    inner = tmp_path / "model"
    inner.mkdir()
    weight = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../secret.bin")
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), inner / "m.onnx")
    _assert_bad_input(farm("submit", inner / "m.onnx", "-o", tmp_path / "out", cwd=tmp_path), "'w'", "secret.bin")
    assert not (tmp_path / "out").exists()


def test_missing_model_and_bad_target(tmp_path):
    _assert_bad_input(farm("submit", "nope.onnx", cwd=tmp_path), "nope.onnx")
    _single_op_model(tmp_path / "m.onnx")
    _assert_bad_input(farm("submit", "m.onnx", "--target", "tpu", cwd=tmp_path), "tpu")


def test_tampered_and_truncated_artifacts(built, tmp_path):
    folder, job = built
    data = bytearray(open(job["artifact"], "rb").read())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "tampered.farm").write_bytes(bytes(data))
    _assert_bad_input(farm("run", "tampered.farm", "--input", f"input={folder / 'x.npy'}", cwd=tmp_path), "tampered")
    (tmp_path / "short.farm").write_bytes(bytes(data[: len(data) // 2]))
    _assert_bad_input(farm("run", "short.farm", "--input", f"input={folder / 'x.npy'}", cwd=tmp_path), "short.farm")


def test_missing_input_name_at_run_time(built):
    folder, job = built
    result = farm("run", job["artifact"], "--input", "data=x.npy", "-o", "never.npz", cwd=folder)
    _assert_bad_input(result, "'input'")
    assert not (folder / "never.npz").exists()


def test_malformed_input_argument(built):
    folder, job = built
    _assert_bad_input(farm("run", job["artifact"], "--input", "x.npy", cwd=folder), "NAME=FILE")
    _assert_bad_input(farm("run", job["artifact"], "--input", "input=missing.npy", cwd=folder), "missing.npy")


def test_build_failure_exits_1_and_leaves_no_artifact(tmp_path):
    _single_op_model(tmp_path / "m.onnx")
    result = farm("submit", "m.onnx", "--workers", "1", cwd=tmp_path, env={"PATH": str(tmp_path / "empty")})
    assert result.returncode == 1, result.stderr
    assert "linker" in result.stderr
    assert not (tmp_path / "artifacts" / "m.farm").exists()


# --- bad connection settings, against a real redis-server that requires a password ---------------------------------

JOB = "0123456789abcdef"
BROKER_COMMANDS = {
    "submit": ["submit", "m.onnx"],
    "status": ["status", JOB],
    "wait": ["wait", JOB],
    "download": ["download", JOB],
    "cancel": ["cancel", JOB],
    "workers": ["workers"],
    "worker": ["worker"],
}
"""Every command that takes --broker, with arguments that would otherwise go on to reach the farm."""


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A redis-server with a password, and a folder holding a model to submit."""
    folder = tmp_path_factory.mktemp("secured")
    onnx.save(examples.tiny_cnn(), folder / "m.onnx")
    with RedisServer(password="s3cret-Pa55") as server:
        yield server, folder


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", BROKER_COMMANDS)
@pytest.mark.parametrize("source", ["--broker", "FARM_BROKER_URL"])
def test_a_broker_url_without_a_scheme_is_refused_at_once(secured, command, source):
    server, folder = secured
    url = f"127.0.0.1:{server.port}"
    options, env = (["--broker", url], {}) if source == "--broker" else ([], {"FARM_BROKER_URL": url})
    result = farm(*BROKER_COMMANDS[command], *options, cwd=folder, env=env)
    assert result.returncode == 2, result.stderr
    assert _one_error_line(result) == (
        f"farm: error: {source} {url}: not a Redis URL (redis://[:password@]host:port/db or rediss://...)"
    )


@pytest.mark.parametrize("command", BROKER_COMMANDS)
def test_a_url_without_the_password_is_refused_by_the_server_and_said_so(secured, command):
    server, folder = secured
    url = f"redis://127.0.0.1:{server.port}/0"
    result = farm(*BROKER_COMMANDS[command], "--broker", url, cwd=folder)
    assert result.returncode == 4, result.stderr
    assert _one_error_line(result) == (
        f"farm: error: the farm's Redis at {url} refused the connection: the URL lacks the password the server requires"
    )


@pytest.mark.parametrize("command", BROKER_COMMANDS)
def test_a_wrong_password_is_refused_at_once_and_never_printed(secured, command):
    """`farm worker` too: no wait mends a password, so it exits before Celery would retry (1/100), (2/100)..."""
    server, folder = secured
    result = farm(*BROKER_COMMANDS[command], "--broker", f"redis://:wrong-pw@127.0.0.1:{server.port}/0", cwd=folder)
    assert result.returncode == 4, result.stderr
    assert _one_error_line(result) == (
        f"farm: error: the farm's Redis at redis://:***@127.0.0.1:{server.port}/0 "
        "refused the connection: the URL has a wrong password (or user)"
    )
    assert "wrong-pw" not in result.stdout + result.stderr


def test_the_right_password_gets_through(secured):
    server, folder = secured
    result = farm("status", JOB, "--broker", server.url, cwd=folder)
    assert result.returncode == 3 and "unknown job" in result.stderr  # it reached the farm's job board


# -- farm jobs through the CLI against a real redis-server with no worker ------------------------------------------

ARTIFACT_MANIFEST, ARTIFACT_MEMBERS = {"model": {"name": "m"}}, {"weights/w.bin": b"weights"}
ARTIFACT = artifact_bytes(ARTIFACT_MANIFEST, ARTIFACT_MEMBERS)
UNIT = "cpu-x/farm_k_1"
Step = Callable[[JobBoard, str], object]


def _to(state: JobState, **fields: object) -> Step:
    return lambda board, job_id: board.advance(job_id, state, **fields)


def _finished(phase: str, *names: str) -> Step:
    return lambda board, job_id: [board.complete(job_id, phase, name) for name in names]


_COMPILING = [
    _to(JobState.PLANNING),
    _to(JobState.COMPILING, total=4, kernels=3, blobs=1),
    _finished("compile", "a", "b"),
]
_LINKING = [*_COMPILING, _finished("compile", "c", "d"), _to(JobState.LINKING)]
PATHS: dict[str, list[Step]] = {
    "queued": [],
    "planning": [_to(JobState.PLANNING)],
    "tuning": [_to(JobState.PLANNING), _to(JobState.TUNING, tune_units=["t/k1", "t/k2"]), _finished("tune", "t/k1")],
    "compiling": _COMPILING,
    "linking": _LINKING,
    "done": [
        *_LINKING,
        lambda board, job_id: board.advance(
            job_id, JobState.DONE, artifact_key=_artifact(board.url), finished=time.time()
        ),
    ],
    "failed before compile": [
        _to(JobState.PLANNING),
        lambda board, job_id: board.fail(job_id, "can't read ONNX model m.onnx: truncated", ExitStatus.BAD_INPUT),
    ],
    "failed at a unit": [
        *_COMPILING,
        lambda board, job_id: board.fail(job_id, f"kernel {UNIT} failed: boom", ExitStatus.BUILD_FAILED, UNIT),
    ],
    "cancelled": [_to(JobState.CANCELLED, error="cancelled by user")],
}
"""How the job board takes a job to each state the CLI must show (a cancelled job and one that failed while
planning have no failed unit)."""
LINES = {
    "queued": "queued, 0/0 compile tasks done",
    "planning": "planning, 0/0 compile tasks done",
    "tuning": "tuning, 0/0 compile tasks done, 1/2 kernels timed",
    "compiling": "compiling, 2/4 compile tasks done",
    "linking": "linking, 4/4 compile tasks done",
    "done": "done, 4/4 compile tasks done",
    "failed before compile": "failed, 0/0 compile tasks done: can't read ONNX model m.onnx: truncated",
    "failed at a unit": f"failed, 2/4 compile tasks done; failed at {UNIT}: kernel {UNIT} failed: boom",
    "cancelled": "cancelled, 0/0 compile tasks done: cancelled by user",
}
LIVE = {"queued", "planning", "tuning", "compiling", "linking"}
ENDED_EXIT = {"done": 0, "failed before compile": 2, "failed at a unit": 1, "cancelled": 3}
ENDED_ERROR = {
    "failed before compile": "failed: can't read ONNX model m.onnx: truncated",
    "failed at a unit": f"failed: kernel {UNIT} failed: boom",
    "cancelled": "was cancelled",
}
NO_WORKER = "farm: no live worker consumes queues control, llvm; start one with 'farm worker'"
NO_TUNER = (
    f"farm: no live worker consumes queue tune.{host_target().id}; start 'farm worker' on a host of CPU class "
    f"{host_target().id}, or its kernels keep the default variants"
)


def _unserved_lines(state: str) -> str:
    """What a command says on stderr about a job in `state` on a farm with no worker."""
    return "".join(f"{line}\n" for line in [NO_WORKER] * (state in LIVE) + [NO_TUNER] * (state == "tuning"))


@pytest.fixture(scope="module")
def farm_redis() -> Iterator[RedisServer]:
    """One redis-server for the module's jobs (each test makes its own), with no worker."""
    with _started_servers() as start:
        yield start()


def _artifact(url: str) -> str:
    """The key of ARTIFACT's recipe, put in the store at `url` (a farm keeps an artifact so: farm.distributed.recipes)."""
    return recipes.put_recipe(RedisStore(url), ARTIFACT_MANIFEST, ARTIFACT_MEMBERS, lambda keys: None)[0]


def _job_in(server: RedisServer, state: str) -> str:
    board, store = JobBoard(server.url), RedisStore(server.url)
    job_id, now = uuid.uuid4().hex[:16], time.time()
    board.create(
        job_id,
        JobRecord(
            JobState.QUEUED,
            store.put(b"model"),
            "m",
            "b" * 64,
            [host_target()],
            tune=state == "tuning",
            created=now,
            updated=now,
        ),
    )
    for step in PATHS[state]:
        step(board, job_id)
    assert board.get(job_id).state.value == state.split()[0]
    return job_id


def _check_status(job_id: str, state: str, result: subprocess.CompletedProcess, server: RedisServer) -> None:
    assert result.returncode == 0 and result.stdout == f"{job_id}: {LINES[state]}\n"
    assert result.stderr == _unserved_lines(state)


def _check_status_json(job_id: str, state: str, result: subprocess.CompletedProcess, server: RedisServer) -> None:
    info = json.loads(result.stdout)
    assert result.returncode == 0 and info["job_id"] == job_id and info["state"] == state.split()[0]
    expected = ["control", "llvm"] + [f"tune.{host_target().id}"] * (state == "tuning") if state in LIVE else None
    assert info.get("no_live_worker") == expected
    assert info.get("failed_unit") == (UNIT if state == "failed at a unit" else None)


def _check_wait(job_id: str, state: str, result: subprocess.CompletedProcess, server: RedisServer) -> None:
    if state in LIVE:
        assert result.returncode == 6 and f"job {job_id} still {state} after 4 s; it goes on" in result.stderr
        assert NO_WORKER in result.stderr
        return
    assert result.returncode == ENDED_EXIT[state]
    if state == "done":
        assert result.stdout == f"{job_id}: done\n"
    else:  # the last line, after any progress bar
        assert result.stderr.splitlines()[-1] == f"farm: error: job {job_id} {ENDED_ERROR[state]}"


def _check_download(job_id: str, state: str, result: subprocess.CompletedProcess, server: RedisServer) -> None:
    if state in LIVE:
        assert result.returncode == 3 and f"job {job_id} is {state}: no artifact yet" in result.stderr
        return
    assert result.returncode == ENDED_EXIT[state]
    if state == "done":
        assert Path(result.stdout.strip()).read_bytes() == ARTIFACT and result.stdout.strip().endswith("m.farm")
    else:
        assert result.stderr == f"farm: error: job {job_id} {ENDED_ERROR[state]}\n"


def _check_cancel(job_id: str, state: str, result: subprocess.CompletedProcess, server: RedisServer) -> None:
    after = JobBoard(server.url).get(job_id).state.value
    if state in LIVE:
        assert result.returncode == 0 and result.stdout == f"{job_id}: cancelled\n" and after == "cancelled"
    else:
        assert result.returncode == 3 and "had already ended" in result.stderr and after == state.split()[0]


COMMANDS = {
    "status": (["status"], _check_status),
    "status --json": (["status", "--json"], _check_status_json),
    "wait": (["wait"], _check_wait),
    "download": (["download", "-o", "{tmp}"], _check_download),
    "cancel": (["cancel"], _check_cancel),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("state", list(PATHS))
def test_every_job_state_through_every_command(
    farm_redis: RedisServer, tmp_path: Path, state: str, command: str
) -> None:
    job_id = _job_in(farm_redis, state)
    words, check = COMMANDS[command]
    args = [words[0], job_id, *(w.format(tmp=tmp_path) for w in words[1:])]
    if command == "wait" and state in LIVE:
        args += ["--timeout", "4"]  # past the first liveness check (2 s)
    result = farm_cli(*args, broker=farm_redis.url, cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    check(job_id, state, result, farm_redis)


class Running:
    """A `farm` command running in the background with FARM_BROKER_URL set; its stderr collected line by line."""

    def __init__(self, *args: str, broker: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        path = os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "farm", *args],
            cwd=cwd,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path, "FARM_BROKER_URL": broker, **(env or {})},
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True)
        self.reader.start()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, seconds: float) -> str:
        """The stderr so far once it holds `text`; fails after `seconds` from the command's start."""
        while text not in self.stderr:
            assert time.monotonic() - self.started < seconds, f"no {text!r} within {seconds} s:\n{self.stderr}"
            assert self.process.poll() is None or text in self.stderr, (
                f"exited {self.process.returncode}:\n{self.stderr}"
            )
            time.sleep(0.05)
        return self.stderr

    def interrupt(self, signum: int = signal.SIGINT) -> tuple[int, str]:
        """Ctrl-C (SIGINT), or SIGTERM as a CI runner sends a cancelled job; then its exit status and stdout."""
        self.process.send_signal(signum)
        return self.finish()

    def finish(self) -> tuple[int, str]:
        stdout = self.process.stdout.read()
        status = self.process.wait(60)
        self.reader.join(10)
        return status, stdout


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("farm-model") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


def _submitted_job(stderr: str) -> str:
    found = re.search(r"farm: job ([0-9a-f]{16}) submitted; farm status \1 / farm cancel \1", stderr)
    assert found, stderr
    return found.group(1)


STOPS = {"ctrl-c": (signal.SIGINT, 130, "interrupted"), "sigterm": (signal.SIGTERM, 143, "terminated (SIGTERM)")}
"""How a waiting command is stopped: Ctrl-C, or SIGTERM (what GitLab, GitHub Actions and Kubernetes send a cancelled
CI job); the documented exit status (128 + the signal's number) and the word it says for each."""


@pytest.mark.parametrize("stop", list(STOPS))
def test_submit_names_its_job_says_no_worker_within_10_s_and_a_stop_cancels_it(
    farm_redis: RedisServer, model_file: Path, tmp_path: Path, stop: str
) -> None:
    signum, exit_status, said = STOPS[stop]
    running = Running("submit", str(model_file), broker=farm_redis.url, cwd=tmp_path)
    job_id = _submitted_job(running.wait_for("submitted", 10))
    running.wait_for(NO_WORKER, 10)  # the production defaults: said within 10 s of the command's start
    status, stdout = running.interrupt(signum)
    assert status == exit_status == 128 + signum and stdout == ""
    assert f"farm: {said}; job {job_id} cancelled\n" in running.stderr and "Aborted" not in running.stderr
    assert JobBoard(farm_redis.url).view(job_id).state == JobState.CANCELLED  # no worker accepted it yet
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stop_during_the_upload_says_that_nothing_was_submitted(
    redis_server: RedisServer, tmp_path: Path, stop: str
) -> None:
    """The upload waits for workers to take its first weight in (a file blob store is published and none is live;
    a window of one byte so that it waits at once): a stop then says where it came and that no job exists."""
    signum, exit_status, said = STOPS[stop]
    weights = [numpy_helper.from_array(np.full((256, 256), i, np.float32), f"w{i}") for i in range(2)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("MatMul", ["h", "w1"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        weights,
    )
    onnx.save(helper.make_model(graph), tmp_path / "mlp.onnx")
    RedisStore(redis_server.url, blobs=FileStore(tmp_path / "cas")).publish_blob_store()
    running = Running(
        "submit",
        str(tmp_path / "mlp.onnx"),
        broker=redis_server.url,
        cwd=tmp_path,
        env={"FARM_UPLOAD_WINDOW_BYTES": "1"},
    )
    running.wait_for("uploading 2 of 2 weights", 20)
    status, stdout = running.interrupt(signum)
    assert status == exit_status and stdout == "", running.stderr
    assert running.stderr.endswith(
        f"farm: {said} while uploading mlp.onnx; nothing was submitted (its staged bytes expire)\n"
    ), running.stderr
    assert "Traceback" not in running.stderr and JobBoard(redis_server.url).redis.zcard(redis_keys.JOBS_KEY) == 0


@pytest.mark.parametrize("stop", list(STOPS))
def test_submit_detach_leaves_the_job_running_at_a_stop(
    farm_redis: RedisServer, model_file: Path, tmp_path: Path, stop: str
) -> None:
    signum, exit_status, said = STOPS[stop]
    running = Running("submit", str(model_file), "--detach", broker=farm_redis.url, cwd=tmp_path)
    job_id = _submitted_job(running.wait_for(NO_WORKER, 10))
    status, _ = running.interrupt(signum)
    assert status == exit_status and f"farm: {said}; job {job_id} goes on: farm wait {job_id}" in running.stderr
    assert JobBoard(farm_redis.url).view(job_id).state == JobState.QUEUED


@pytest.mark.parametrize("stop", list(STOPS))
def test_wait_stops_at_a_stop_and_leaves_the_job_running(farm_redis: RedisServer, tmp_path: Path, stop: str) -> None:
    signum, exit_status, said = STOPS[stop]
    job_id = _job_in(farm_redis, "compiling")
    running = Running("wait", job_id, broker=farm_redis.url, cwd=tmp_path)
    running.wait_for(NO_WORKER, 10)
    status, _ = running.interrupt(signum)
    assert status == exit_status and f"farm: {said}; job {job_id} goes on" in running.stderr
    assert JobBoard(farm_redis.url).get(job_id).state == JobState.COMPILING


def test_no_wait_still_names_the_job_on_stderr(farm_redis: RedisServer, model_file: Path, tmp_path: Path) -> None:
    result = farm_cli("submit", str(model_file), "--no-wait", "--json", broker=farm_redis.url, cwd=tmp_path)
    assert result.returncode == 0
    assert json.loads(result.stdout)["job_id"] == _submitted_job(result.stderr)


def test_redis_lost_while_submit_waits_names_the_job_to_resume(
    redis_server: RedisServer, model_file: Path, tmp_path: Path
) -> None:
    running = Running("submit", str(model_file), broker=redis_server.url, cwd=tmp_path)
    job_id = _submitted_job(running.wait_for(NO_WORKER, 10))
    redis_server.kill()
    status, stdout = running.finish()
    assert status == ExitStatus.UNREACHABLE == 4 and stdout == ""
    assert f"job {job_id} may still be running" in running.stderr and f"'farm wait {job_id}'" in running.stderr
    assert "Traceback" not in running.stderr


def test_jobs_lists_recent_jobs_newest_first(redis_server: RedisServer, model_file: Path, tmp_path: Path) -> None:
    empty = farm_cli("jobs", "--json", broker=redis_server.url, cwd=tmp_path)
    assert empty.returncode == 0 and json.loads(empty.stdout)["jobs"] == [] and "no jobs" in empty.stderr
    ids = [
        json.loads(
            farm_cli("submit", str(model_file), "--no-wait", "--json", broker=redis_server.url, cwd=tmp_path).stdout
        )["job_id"]
        for _ in range(2)
    ]
    assert farm_cli("cancel", ids[0], broker=redis_server.url, cwd=tmp_path).returncode == 0
    listed = farm_cli("jobs", broker=redis_server.url, cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == ""
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert [row[:3] for row in rows] == [[ids[1], "queued", "tiny_cnn"], [ids[0], "cancelled", "tiny_cnn"]]
    assert all(re.fullmatch(r"\d+[smhd]", row[3]) and row[4] == "ago" for row in rows)
    one = json.loads(farm_cli("jobs", "--json", "--limit", "1", broker=redis_server.url, cwd=tmp_path).stdout)["jobs"]
    assert [(job["job_id"], job["state"], job["model"]) for job in one] == [(ids[1], "queued", "tiny_cnn")]
    assert one[0]["age_s"] >= 0 and one[0]["created"] > 0
    bad = farm_cli("jobs", "--limit", "0", broker=redis_server.url, cwd=tmp_path)
    assert bad.returncode == 2 and "--limit" in bad.stderr


HOSTILE_NAME = "evil\x1b[31m\n0123456789abcdef  done       forged"
"""A model's name as a submitter may choose it (a file may be named so): an escape sequence, then a line break and
what would read as another job's line."""


def test_jobs_lists_a_hostile_model_name_escaped_on_one_line(
    redis_server: RedisServer, model_file: Path, tmp_path: Path
) -> None:
    """`farm jobs` on the operator's terminal: a model name's control characters print as escapes, so the name can't
    recolour the terminal or forge a job line; --json carries the name exactly."""
    hostile = tmp_path / f"{HOSTILE_NAME}.onnx"
    hostile.write_bytes(model_file.read_bytes())
    submitted = farm_cli("submit", str(hostile), "--no-wait", "--json", broker=redis_server.url, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    listed = farm_cli("jobs", broker=redis_server.url, cwd=tmp_path)
    assert listed.returncode == 0 and "\x1b" not in listed.stdout, listed.stdout
    [line] = listed.stdout.splitlines()
    assert line.startswith(f"{job_id}  queued     evil\\x1b[31m\\n0123456789abcdef  done       forged "), line
    as_json = json.loads(farm_cli("jobs", "--json", broker=redis_server.url, cwd=tmp_path).stdout)
    assert [job["model"] for job in as_json["jobs"]] == [HOSTILE_NAME]


def test_a_jobs_error_prints_escaped_on_one_line(farm_redis: RedisServer, tmp_path: Path) -> None:
    """A job's error names what the model chose (a node's name): `farm status` and `farm wait` print it escaped."""
    job_id = _job_in(farm_redis, "planning")
    JobBoard(farm_redis.url).fail(job_id, f"node {HOSTILE_NAME} is not supported", ExitStatus.BAD_INPUT)
    shown = "node evil\\x1b[31m\\n0123456789abcdef  done       forged is not supported"
    status = farm_cli("status", job_id, broker=farm_redis.url, cwd=tmp_path)
    assert status.returncode == 0 and status.stdout == f"{job_id}: failed, 0/0 compile tasks done: {shown}\n"
    waited = farm_cli("wait", job_id, broker=farm_redis.url, cwd=tmp_path)
    assert waited.returncode == ExitStatus.BAD_INPUT and waited.stdout == ""
    assert "\x1b" not in waited.stderr and waited.stderr.endswith(f"\nfarm: error: job {job_id} failed: {shown}\n")


def test_workers_says_when_none_is_live(redis_server: RedisServer, tmp_path: Path) -> None:
    text = farm_cli("workers", broker=redis_server.url, cwd=tmp_path)
    assert text.returncode == 0 and text.stdout == ""
    assert text.stderr == "farm: no live worker on this farm; start one with 'farm worker'\n"
    listed = farm_cli("workers", "--json", broker=redis_server.url, cwd=tmp_path)
    assert listed.returncode == 0 and json.loads(listed.stdout)["workers"] == [] and "no live worker" in listed.stderr


# ------------------------------------------------------------------------------------ hostile models and inputs


def _save_graph(path, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _conv(x_type=TensorProto.FLOAT, channels=3, w_dtype=np.float32, **attrs):
    """x[1, channels, 8, 8] -> Conv(W[4, 3, 3, 3]) named 'conv' -> y."""
    return (
        [helper.make_node("Conv", ["x", "W"], ["y"], name="conv", **attrs)],
        [helper.make_tensor_value_info("x", x_type, [1, channels, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 3, 3, 3), w_dtype), "W")],
    )


_HOSTILE_MODELS = {
    "group-zero": (_conv(group=0), ["'conv'", "'group' is 0"]),
    "group-negative": (_conv(group=-2), ["'conv'", "'group' is -2"]),
    "group-string": (_conv(group="two"), ["'conv'", "'group' is of type STRING, expected INT"]),
    "pads-floats": (_conv(pads=[1.0, 1.0, 1.0, 1.0]), ["'conv'", "'pads' is of type FLOATS, expected INTS"]),
    "integer-input": (_conv(TensorProto.INT64, w_dtype=np.int64), ["'conv'", "input 'x' has dtype int64"]),
    "channel-mismatch": (_conv(channels=5), ["'conv'", "input 'x' has 5 channels"]),
    "alpha-ints": (
        (
            [helper.make_node("LeakyRelu", ["x"], ["y"], name="lrelu", alpha=[1, 2])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        ["'lrelu'", "'alpha' is of type INTS, expected FLOAT"],
    ),
    "axis-graph": (
        (
            [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=helper.make_graph([], "s", [], []))],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        ["'sm'", "'axis' is of type GRAPH, expected INT"],
    ),
    "lrn-size-zero": (
        (
            [helper.make_node("LRN", ["x"], ["y"], name="lrn", size=0)],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        ["'lrn'", "'size' is 0"],
    ),
    "undefined-output": (
        (
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "nope")],
        ),
        ["graph output 'nope' is not defined"],
    ),
    "empty-input-name": (
        (
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("", "x")],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        ["a graph input has an empty name"],
    ),
}


@pytest.mark.parametrize("case", sorted(_HOSTILE_MODELS))
def test_hostile_model_is_refused_with_one_line(tmp_path, case):
    parts, fragments = _HOSTILE_MODELS[case]
    _save_graph(tmp_path / "m.onnx", *parts)
    result = farm("submit", "m.onnx", cwd=tmp_path)
    _assert_bad_input(result, *fragments)
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "artifacts" / "m.farm").exists()


def test_invalid_utf8_name_and_nul_in_external_location(tmp_path):
    _save_graph(
        tmp_path / "m.onnx",
        [helper.make_node("Relu", ["x"], ["qq"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("qq", TensorProto.FLOAT, None)],
    )
    (tmp_path / "utf8.onnx").write_bytes((tmp_path / "m.onnx").read_bytes().replace(b"qq", b"\xff\xfe"))
    result = farm("submit", "utf8.onnx", cwd=tmp_path)
    _assert_bad_input(result, "is not valid UTF-8")
    assert "Traceback" not in result.stderr
    weight = numpy_helper.from_array(np.ones(6, np.float32), "W")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="w\x00.bin")
    _save_graph(
        tmp_path / "nul.onnx",
        [helper.make_node("Add", ["x", "W"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    result = farm("submit", "nul.onnx", cwd=tmp_path)
    _assert_bad_input(result, "'W'", "NUL byte")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("where", ["local", "farm"])
def test_external_data_claiming_more_than_its_file_holds_exits_2_in_one_line(redis_server, tmp_path, where):
    """A weight whose external data claims 2**62 bytes of a 24-byte file: refused before anything is read (it once
    ended `farm submit` in a MemoryError traceback, exit 1), by a local build and by the farm's client alike."""
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2, 3], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(2**62))):
        weight.external_data.add(key=key, value=value)
    _save_graph(
        tmp_path / "huge.onnx",
        [helper.make_node("Add", ["x", "W"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    (tmp_path / "w.bin").write_bytes(b"\x00" * 24)
    result = farm_cli("submit", "huge.onnx", broker=redis_server.url if where == "farm" else "", cwd=tmp_path)
    _assert_bad_input(result, "initializer 'W'", "w.bin", "holds 24 bytes", str(2**62))
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "artifacts").exists()


def test_npy_header_claiming_more_than_the_file_holds(built, tmp_path):
    folder, job = built
    header = {"descr": "<f4", "fortran_order": False, "shape": (2**20, 2**20)}
    with open(tmp_path / "huge.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 64)
    result = farm("run", job["artifact"], "--input", f"input={tmp_path / 'huge.npy'}", cwd=tmp_path)
    _assert_bad_input(result, "huge.npy", "claims shape [1048576, 1048576]")
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr


@pytest.mark.parametrize("name", ["file", "allow_pickle"])
def test_outputs_named_like_savez_arguments_are_written(tmp_path, name):
    _save_graph(
        tmp_path / "m.onnx",
        [helper.make_node("Relu", ["x"], [name], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)],
    )
    assert farm("submit", "m.onnx", cwd=tmp_path).returncode == 0
    x = np.float32([[-1, 2, -3], [4, -5, 6]])
    np.save(tmp_path / "x.npy", x)
    result = farm("run", "artifacts/m.farm", "--input", "x=x.npy", "-o", "out.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")[name], np.maximum(x, 0))


# ---------------------------------------------------------------------- every command's bad input: one line, no trace

BAD_INPUTS = {
    "farm with an unknown command": (["nosuch"], "No such command 'nosuch'"),
    "submit a folder": (["submit", "."], "is a directory"),
    "submit a missing model": (["submit", "missing.onnx"], "missing.onnx: no such model file"),
    "submit without a model": (["submit"], "Missing argument 'MODEL'"),
    "submit an unknown option": (
        ["submit", "tiny_cnn.onnx", "--bogus"],
        "No such option '--bogus' (see 'farm submit --help')",
    ),
    "submit an unknown target": (["submit", "tiny_cnn.onnx", "--target", "tpu"], "tpu"),
    "submit a malformed --shape": (["submit", "tiny_cnn.onnx", "--shape", "batch"], "--shape"),
    "submit --no-wait without a farm": (["submit", "tiny_cnn.onnx", "--no-wait"], "--no-wait needs a farm"),
    "submit --detach without a farm": (["submit", "tiny_cnn.onnx", "--detach"], "--detach needs a farm"),
    "run a folder": (["run", "."], "is a directory"),
    "run a missing artifact": (["run", "missing.farm"], "missing.farm"),
    "run a model as an artifact": (["run", "tiny_cnn.onnx", "--input", "input=x.npy"], "tiny_cnn.onnx"),
    "run a model file as an input": (
        ["run", "ARTIFACT", "--input", "input=tiny_cnn.onnx"],
        "can't read 'tiny_cnn.onnx' as a .npy array",
    ),
    "run an input given twice": (
        ["run", "ARTIFACT", "--input", "input=x.npy", "--input", "input=x.npy"],
        "--input input is given twice",
    ),
    "run on an unknown device": (["run", "ARTIFACT", "--device", "tpu"], "'--device'"),
    "run on a negative thread count": (["run", "ARTIFACT", "--threads", "-1"], "'--threads'"),
    "run a target the artifact lacks": (
        ["run", "ARTIFACT", "--target", "cpu:riscv64-linux-gnu", "--input", "input=x.npy"],
        "no target 'cpu:riscv64-linux-gnu' in the artifact; it has cpu-",
    ),
    "run a CPU target on the OpenCL device": (
        ["run", "ARTIFACT", "--device", "opencl", "--target", "cpu"],
        "selects one of the artifact's CPU targets",
    ),
    "inspect a missing artifact": (["inspect", "missing.farm"], "missing.farm"),
    "inspect a model as an artifact": (["inspect", "tiny_cnn.onnx"], "tiny_cnn.onnx"),
    "bench a missing artifact": (["bench", "missing.farm"], "missing.farm"),
    "bench no repeats": (["bench", "ARTIFACT", "--repeat", "0"], "'--repeat'"),
    "bench a target the artifact lacks": (
        ["bench", "ARTIFACT", "--target", "cpu-aarch64-nope"],
        "no target 'cpu-aarch64-nope' in the artifact",
    ),
    "sign with a missing key": (["sign", "ARTIFACT", "--key", "missing.pem"], "missing.pem"),
    "status without a farm": (["status", "abc"], "no farm configured"),
    "wait without a farm": (["wait", "abc"], "no farm configured"),
    "download without a farm": (["download", "abc"], "no farm configured"),
    "cancel without a farm": (["cancel", "abc"], "no farm configured"),
    "jobs without a farm": (["jobs"], "no farm configured"),
    "workers without a farm": (["workers"], "no farm configured"),
    "worker without a farm": (["worker"], "no farm configured"),
    "status with a broker that is no URL": (["status", "abc", "--broker", "localhost:6379"], "--broker"),
    "wait a negative timeout": (["wait", "abc", "--timeout", "-1"], "'--timeout'"),
    "acl without its file": (["acl"], "Missing option '-o'"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_every_command_refuses_bad_input_in_one_line_with_exit_2(built, case):
    folder, job = built
    args, fragment = BAD_INPUTS[case]
    result = farm(
        *[job["artifact"] if arg == "ARTIFACT" else arg for arg in args], cwd=folder, env={"FARM_BROKER_URL": ""}
    )
    lines = result.stderr.splitlines()
    assert result.returncode == ExitStatus.BAD_INPUT and result.stdout == "", (result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("farm: error: ") and fragment in lines[0], result.stderr


def test_submit_o_file_farm_writes_that_file_and_touches_nothing_else(built, tmp_path):
    folder, _ = built
    (tmp_path / "tiny_cnn.farm").write_bytes(b"someone else's")
    result = farm("submit", folder / "tiny_cnn.onnx", "-o", tmp_path / "v2.farm", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["artifact"] == str(tmp_path / "v2.farm")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_cnn.farm", "v2.farm"]
    assert (tmp_path / "tiny_cnn.farm").read_bytes() == b"someone else's"
    ran = farm("run", tmp_path / "v2.farm", "--input", f"input={folder / 'x.npy'}", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["outputs"] == {"output": {"shape": [1, 10], "dtype": "float32"}}


def test_json_objects_have_every_key_of_their_schema(built, tmp_path):
    from farm.cli import schemas

    folder, job = built
    assert set(job) == {"command", "schema", *schemas.BUILD_KEYS} and job["command"] == "submit"
    assert job["compiled"] + job["cached"] == job["kernels"] + job["blobs"] and job["sizes"] == []
    assert job["model"] == "tiny_cnn" and job["targets"] == [host_target().id] and job["tuning"] is None
    ran = json.loads(
        farm("run", job["artifact"], "--input", "input=x.npy", "-o", tmp_path / "y.out", "--json", cwd=folder).stdout
    )
    assert set(ran) == {"command", "schema", "artifact", "device", "target", "emulated", "outputs", "output_file"}
    assert ran["output_file"] == str(tmp_path / "y.out") and (tmp_path / "y.out").is_file()  # the name as given
    assert ran["target"] == host_target().id and ran["emulated"] is False
    failed = farm("run", job["artifact"], "--input", "nope=x.npy", "--json", cwd=folder)
    assert json.loads(failed.stdout) == {
        "command": "run",
        "schema": 1,
        "artifact": None,
        "device": None,
        "target": None,
        "emulated": None,
        "outputs": None,
        "output_file": None,
        "state": "failed",
        "error": failed.stderr.strip().removeprefix("farm: error: "),
        "exit_status": 2,
    }


def test_a_build_this_host_cannot_run_says_so(tmp_path):
    onnx.save(examples.tiny_cnn(), tmp_path / "tiny_cnn.onnx")
    result = farm("submit", "tiny_cnn.onnx", "--target", "cpu:aarch64-linux-gnu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no target for this host" in result.stderr and "arch aarch64 is not" in result.stderr
    assert "add --target cpu to run it here too (farm run --target cpu-aarch64-" in result.stderr
    assert "runs it under qemu)" in result.stderr


FOREIGN_CPU_CANDIDATES = {
    "x86_64": ("diamondrapids", "graniterapids", "sapphirerapids", "znver5", "znver4", "x86-64-v4", "znver3"),
    "aarch64": ("neoverse-v3", "neoverse-v2", "a64fx", "neoverse-v1", "neoverse-n2"),
}


def _cpu_this_host_cannot_run() -> tuple[str, list[str]]:
    """A CPU of this host's architecture whose code may use features this host lacks, and those features."""
    from farm.backends.llvm.features import required_features
    from farm.backends.llvm.target import CpuTarget
    from farm.runtime.host import missing_features, this_host

    host = this_host()
    for cpu in FOREIGN_CPU_CANDIDATES[host.arch]:
        missing = missing_features(required_features(CpuTarget(host.triple, cpu)), host)
        if missing:
            return cpu, missing
    raise AssertionError(f"this {host.describe()} runs code for every CPU of {FOREIGN_CPU_CANDIDATES[host.arch]}")


def test_an_artifact_for_a_cpu_this_host_lacks_is_refused_in_one_line_not_by_sigill(tmp_path):
    """Issue 28: a build for a newer CPU (named, its features implied) used to die of SIGILL (exit 132) in `farm
    run`. Now run, bench and farm.runtime.load refuse it naming the features the host lacks (exit 2), and submit's
    note says the same; with a target this host runs beside it, that one runs."""
    cpu, missing = _cpu_this_host_cannot_run()
    host = host_target()
    onnx.save(examples.tiny_cnn(), tmp_path / "tiny_cnn.onnx")
    np.save(tmp_path / "x.npy", examples.random_input(examples.tiny_cnn())["input"])
    built = farm("submit", "tiny_cnn.onnx", "--target", f"cpu:{host.triple}:{cpu}", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    lacks = f"cpu {cpu}: host lacks {','.join(missing)})"
    assert f"{lacks}; add --target cpu" in built.stderr
    for command in (["run", "artifacts/tiny_cnn.farm", "--input", "input=x.npy"], ["bench", "artifacts/tiny_cnn.farm"]):
        refused = farm(*command, cwd=tmp_path)
        assert refused.returncode == 2, (command, refused.returncode, refused.stderr)
        assert refused.stderr.startswith("farm: error: ") and refused.stderr.strip().endswith(lacks)
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
    loaded = subprocess.run(
        [sys.executable, "-c", "import farm.runtime; farm.runtime.load('artifacts/tiny_cnn.farm')"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": CHECKOUT},
    )
    assert loaded.returncode == 1 and "farm.errors.ArtifactError: " in loaded.stderr and lacks in loaded.stderr
    both = farm(
        "submit", "tiny_cnn.onnx", "--target", f"cpu:{host.triple}:{cpu}", "--target", "cpu", "-o", "both", cwd=tmp_path
    )
    assert both.returncode == 0 and "note" not in both.stderr, both.stderr
    ran = farm("run", "both/tiny_cnn.farm", "--input", "input=x.npy", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr


def test_an_opencl_artifact_without_device_or_platform_says_what_to_do(tmp_path):
    onnx.save(examples.tiny_cnn(), tmp_path / "tiny_cnn.onnx")
    np.save(tmp_path / "x.npy", examples.random_input(examples.tiny_cnn())["input"])
    assert farm("submit", "tiny_cnn.onnx", "--target", "opencl", cwd=tmp_path).returncode == 0
    on_cpu = farm("run", "artifacts/tiny_cnn.farm", "--input", "input=x.npy", cwd=tmp_path)
    _assert_bad_input(on_cpu, "no CPU target, only OpenCL programs: run it with --device opencl")
    (tmp_path / "no-icd").mkdir()
    no_platform = farm(
        "run",
        "artifacts/tiny_cnn.farm",
        "--device",
        "opencl",
        "--input",
        "input=x.npy",
        cwd=tmp_path,
        env={"OCL_ICD_VENDORS": str(tmp_path / "no-icd")},
    )
    _assert_bad_input(no_platform, "no OpenCL device on this host")
    assert len(no_platform.stderr.splitlines()) == 1
