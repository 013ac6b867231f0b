"""The `farm` command end to end, as a user runs it: real processes, real files, documented exit statuses."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.tools import examples
from tests.services import RedisServer

# The checkout under test first on the path, so that `python -m farm` runs it even where another checkout is the
# installed one.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(examples.__file__))))


def farm(*args, cwd, env=None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "farm", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})}, timeout=300)


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
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
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
    assert "kernels+blobs" in result.stderr


def test_run_writes_outputs_that_match_onnxruntime(built):
    import onnxruntime

    folder, job = built
    result = farm("run", job["artifact"], "--input", "input=x.npy", "-o", "out.npz", "--print", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "output: shape [1, 10]" in result.stdout
    ours = np.load(folder / "out.npz")["output"]
    reference = onnxruntime.InferenceSession(str(folder / "tiny_cnn.onnx")).run(None, {"input": np.load(folder / "x.npy")})
    assert np.abs(ours - reference[0]).max() <= 1e-4
    threaded = farm("run", job["artifact"], "--input", "input=x.npy", "-o", "out3.npz", "--threads", "3", cwd=folder)
    assert threaded.returncode == 0, threaded.stderr
    np.testing.assert_array_equal(np.load(folder / "out3.npz")["output"], ours)
    every_cpu = farm("run", job["artifact"], "--input", "input=x.npy", "-o", "out0.npz", "--threads", "0", cwd=folder)
    assert every_cpu.returncode == 0, every_cpu.stderr
    refused = farm("run", job["artifact"], "--input", "input=x.npy", "--threads", "-1", cwd=folder)
    assert refused.returncode == 2 and "--threads" in refused.stderr


def _assert_bad_input(result, *fragments):
    assert result.returncode == 2, (result.stdout, result.stderr)
    for fragment in fragments:
        assert fragment in result.stderr


def test_truncated_model(tmp_path):
    model = examples.tiny_cnn().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(model[: len(model) // 3])
    _assert_bad_input(farm("submit", "cut.onnx", cwd=tmp_path), "cut.onnx")
    assert not (tmp_path / "artifacts" / "cut.farm").exists()


def test_unsupported_op_names_node_op_domain_and_opset(tmp_path):
    _single_op_model(tmp_path / "m.onnx", op="Acos")
    result = farm("submit", "m.onnx", "--json", cwd=tmp_path)
    _assert_bad_input(result, "'the_node'", "'Acos'", "ai.onnx", "opset 17")
    assert json.loads(result.stdout)["state"] == "failed"
    assert not (tmp_path / "artifacts" / "m.farm").exists()


def test_dynamic_dimension(tmp_path):
    _single_op_model(tmp_path / "m.onnx", shape=("N", 3))
    _assert_bad_input(farm("submit", "m.onnx", cwd=tmp_path), "dynamic")
    assert not (tmp_path / "artifacts" / "m.farm").exists()


def test_external_data_outside_the_model_folder(tmp_path):
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    inner = tmp_path / "model"
    inner.mkdir()
    weight = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../secret.bin")
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[weight])
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
BROKER_COMMANDS = {"submit": ["submit", "m.onnx"], "status": ["status", JOB], "wait": ["wait", JOB],
                   "download": ["download", JOB], "cancel": ["cancel", JOB], "workers": ["workers"],
                   "worker": ["worker"]}
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
    assert _one_error_line(result) == (f"farm: error: {source} {url}: not a Redis URL "
                                       "(redis://[:password@]host:port/db or rediss://...)")


@pytest.mark.parametrize("command", BROKER_COMMANDS)
def test_a_url_without_the_password_is_refused_by_the_server_and_said_so(secured, command):
    server, folder = secured
    url = f"redis://127.0.0.1:{server.port}/0"
    result = farm(*BROKER_COMMANDS[command], "--broker", url, cwd=folder)
    assert result.returncode == 4, result.stderr
    assert _one_error_line(result) == (f"farm: error: the farm's Redis at {url} refused the connection: the URL "
                                       "lacks the password the server requires")


@pytest.mark.parametrize("command", BROKER_COMMANDS)
def test_a_wrong_password_is_refused_at_once_and_never_printed(secured, command):
    """`farm worker` too: no wait mends a password, so it exits before Celery would retry (1/100), (2/100)..."""
    server, folder = secured
    result = farm(*BROKER_COMMANDS[command], "--broker", f"redis://:wrong-pw@127.0.0.1:{server.port}/0", cwd=folder)
    assert result.returncode == 4, result.stderr
    assert _one_error_line(result) == (f"farm: error: the farm's Redis at redis://:***@127.0.0.1:{server.port}/0 "
                                       "refused the connection: the URL has a wrong password (or user)")
    assert "wrong-pw" not in result.stdout + result.stderr


def test_the_right_password_gets_through(secured):
    server, folder = secured
    result = farm("status", JOB, "--broker", server.url, cwd=folder)
    assert result.returncode == 3 and "unknown job" in result.stderr  # it reached the farm's job board
