"""The farm's wire protocol (farm/distributed/protocol.py): records and task arguments round-trip through their
encodings, and every decode refuses malformed input naming what is wrong."""

from __future__ import annotations

import json

import pytest

from farm.backends.llvm.target import CpuTarget
from farm.backends.opencl.target import OpenClTarget
from farm.build.units import CompileUnit
from farm.distributed import protocol
from farm.distributed.protocol import (
    TASK_ARGS,
    Compile,
    Finish,
    JobRecord,
    JobState,
    Link,
    PlanJob,
    TaskName,
    Tune,
    encode_fields,
    encode_record,
)
from farm.errors import BadInputError
from farm.ir.graph import TensorInfo
from farm.ir.specs import BlobSpec, KernelSpec

JOB = "0123456789abcdef"
CPU = CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2,+fma")
DEVICE = OpenClTarget("fedcba9876543210")
SPEC = KernelSpec("Relu", "{}", (TensorInfo((1, 4), "float32"),), (TensorInfo((1, 4), "float32"),), None, "")


def record(**fields: object) -> JobRecord:
    return JobRecord(JobState.QUEUED, "a" * 64, "model", "b" * 64, [CPU, DEVICE], created=1.5, updated=2.5, **fields)


def test_a_record_round_trips_through_its_hash_fields() -> None:
    full = record(no_cache=True, tune=True, total=13, kernels=7, blobs=6, targets_total=1, link_plan_key="c" * 64,
                  tune_units=["a/k"], tune_errors={"a/k": "boom"}, libraries={CPU.id: "d" * 64}, exit_status=2,
                  lost_workers={f"w2@host#{'e' * 32}": 3})
    fields = encode_record(full)
    assert all(isinstance(value, str) for value in fields.values())
    assert fields["no_cache"] == "True" and fields[f"library:{CPU.id}"] == "d" * 64 and "finished" not in fields
    assert fields[f"lost_worker:w2@host#{'e' * 32}"] == "3"
    assert JobRecord.decode(fields) == full


def test_partial_updates_encode_only_their_fields() -> None:
    assert encode_fields(state=JobState.DONE, total=0, cached=True) == {"state": "done", "total": "0", "cached": "True"}
    with pytest.raises(ValueError, match="no job record field 'plan_key'"):
        encode_fields(plan_key="x")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("state", "exploded", "'state'"),
    ("targets", json.dumps([{"kind": "tpu"}]), "unknown target kind 'tpu'"),
    ("targets", json.dumps([{"kind": "cpu", "triple": "x86_64\"; ret", "cpu": "a", "features": ""}]), "triple"),
    ("targets", json.dumps([{"kind": "opencl", "fingerprint": "../../etc"}]), "fingerprint"),
    ("model_key", "../../etc/passwd", "'model_key'"),
    ("model_name", "../escape", "can't name a file"),
    ("total", "many", "'total'"),
    ("tune_units", json.dumps({"a": 1}), "'tune_units'"),
    ("lost_worker:w2@host#i", "many", "'lost_workers' is malformed"),
    ("lost_worker:w2@host#i", "0", "'lost_workers' is malformed"),
    ("lost_worker:w2@host", "1", "not a worker's name#incarnation"),
    ("lost_worker:#i", "1", "not a worker's name#incarnation"),
    (f"lost_worker:{'w' * 600}#i", "1", "not a worker's name#incarnation"),
])
def test_a_malformed_field_is_refused_by_name(field: str, value: str, message: str) -> None:
    fields = encode_record(record())
    fields[field] = value
    with pytest.raises(BadInputError, match=message):
        JobRecord.decode(fields)


def test_a_record_without_its_model_is_refused() -> None:
    fields = encode_record(record())
    del fields["model_key"], fields["targets"]
    with pytest.raises(BadInputError, match="lacks model_key, targets"):
        JobRecord.decode(fields)


def test_tuning_is_asked_until_the_tuning_phase_ran() -> None:
    assert record(tune=True).tuning_asked("tune") and not record(tune=True, tuned=True).tuning_asked("tune")
    assert not record().tuning_asked("retune") and record().is_over is False
    assert record().__class__(JobState.CANCELLED, "a" * 64, "m", "b" * 64, []).is_over


UNITS = {
    "kernel": CompileUnit("kernel", SPEC.__class__(**{**SPEC.__dict__, "target_id": CPU.id}), CPU),
    "blob": CompileUnit("blob", BlobSpec("e" * 64, 64, CPU.id), CPU),
    "clkernel": CompileUnit("clkernel", SPEC.__class__(**{**SPEC.__dict__, "target_id": "opencl"}), DEVICE),
}


@pytest.mark.parametrize(("args", "task", "queue"), [
    (PlanJob(JOB), "farm.plan_job", "control"),
    (Finish(JOB), "farm.finish", "control"),
    (Link(JOB, CPU.id), "farm.link", "llvm"),
    (Compile(JOB, UNITS["kernel"]), "farm.compile_cpu_kernel", "llvm"),
    (Compile(JOB, UNITS["blob"]), "farm.pack_blob", "llvm"),
    (Compile(JOB, UNITS["clkernel"]), "farm.compile_cl_kernel", f"opencl.{DEVICE.fingerprint}"),
    (Tune(JOB, f"{CPU.id}/k", SPEC, CPU), "farm.tune_kernel", f"tune.{CPU.id}"),
], ids=lambda value: getattr(value, "task", None) and type(value).__name__)
def test_task_arguments_round_trip_as_json(args: protocol.TaskArgs, task: str, queue: str) -> None:
    message = args.message()
    assert (message.task, message.queue) == (task, queue) and message.args[0] == JOB
    assert protocol.decode(task, json.loads(json.dumps(message.args))) == args


def test_compile_arguments_name_the_unit_what_it_is_and_its_target_for_flower() -> None:
    assert Compile(JOB, UNITS["kernel"]).encode()[:4] == [JOB, UNITS["kernel"].name, "Relu", CPU.id]
    assert Compile(JOB, UNITS["blob"]).encode()[2] == "64 bytes"


@pytest.mark.parametrize(("task", "args", "message"), [
    ("farm.rm_rf", [JOB], "unknown farm task"),
    ("farm.plan_job", [], "list of 1"),
    ("farm.plan_job", ["../x"], "not a job id"),
    ("farm.plan_job", JOB, "list of 1"),
    ("farm.link", [JOB, 7], "library must be a string"), ("farm.link", [JOB, ""], "1 to 256 characters"),
    ("farm.compile_cpu_kernel", [JOB, "u", "Relu", "t", {"kind": "shell"}], "not a compile unit"),
    ("farm.compile_cpu_kernel", [JOB, "u", "Relu", "t", {"kind": "kernel", "spec": {}, "target": CPU.to_json()}],
     "malformed spec"),
    ("farm.tune_kernel", [JOB, "u", "Relu", "t", SPEC.to_json(), {"kind": "cpu"}], "target"),
])
def test_malformed_task_arguments_are_refused(task: str, args: object, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        protocol.decode(task, args)


def test_every_task_has_arguments_and_a_queue() -> None:
    assert set(TASK_ARGS) == {task.value for task in TaskName}
    assert set(protocol.FIXED_QUEUES) | {"farm.compile_cl_kernel", "farm.tune_kernel"} == set(TASK_ARGS)


def test_a_worker_consumes_control_llvm_its_cpus_tuning_and_its_devices() -> None:
    assert protocol.worker_queues(CPU.id, ["ab" * 8]) == ["control", "llvm", f"tune.{CPU.id}", f"opencl.{'ab' * 8}"]
    assert protocol.job_key(JOB) == f"farm:job:{JOB}" and protocol.phase_key(JOB, "compile").endswith(":compile")


def test_capabilities_round_trip_and_garbage_advertises_nothing() -> None:
    capabilities = {"host": "h", "cpu": {"id": CPU.id}, "opencl": [{"fingerprint": DEVICE.fingerprint}]}
    assert protocol.decode_capabilities(protocol.encode_capabilities(capabilities)) == capabilities
    assert protocol.decode_capabilities("not json") == protocol.decode_capabilities("[1]") == {}
    assert protocol.decode_capabilities(None) == {}


def test_the_job_index_and_events_channel_are_named_here() -> None:
    assert protocol.JOBS_KEY == "farm:jobs"
    assert protocol.job_events_channel(JOB) == f"farm:job:{JOB}:events"


def test_a_request_round_trips_to_a_queued_record_with_its_graph_key_and_model_sha256() -> None:
    """The submitter stages a split graph (model_key) and names its model file's sha256 apart: both travel."""
    job_id, request = protocol.encode_request(record(no_cache=True, submitted_from="ci-runner"))
    assert protocol.check_job_id(job_id) == job_id and set(request) == {*protocol.REQUEST_FIELDS, "nonce"}
    decoded = protocol.decode_request(request, job_id)
    assert decoded.state == JobState.QUEUED and decoded.model_key == "a" * 64 and decoded.model_sha256 == "b" * 64
    assert decoded.targets == [CPU, DEVICE] and decoded.no_cache and decoded.submitted_from == "ci-runner"
    assert protocol.encode_request(record())[0] != protocol.encode_request(record())[0]  # the nonce differs


REQUEST_FORGERIES = {
    "a field only the farm sets": ({"artifact_key": "c" * 64}, "fields it may not set: artifact_key"),
    "a state": ({"state": "done"}, "fields it may not set: state"),
    "a rewritten target": ({"targets": json.dumps([CPU.to_json()])}, "not the one its id was made from"),
    "a rewritten model": ({"model_sha256": "c" * 64}, "not the one its id was made from"),
    "a malformed nonce": ({"nonce": "x"}, "not the one its id was made from"),
}


@pytest.mark.parametrize(("changes", "message"), REQUEST_FORGERIES.values(), ids=REQUEST_FORGERIES.keys())
def test_a_forged_request_is_refused_naming_why(changes: dict[str, str], message: str) -> None:
    job_id, request = protocol.encode_request(record())
    with pytest.raises(BadInputError, match=message):
        protocol.decode_request({**request, **changes}, job_id)


def test_a_request_with_a_field_missing_or_malformed_is_refused_even_when_its_id_matches() -> None:
    _, request = protocol.encode_request(record())
    del request["targets"]
    with pytest.raises(BadInputError, match="lacks targets"):
        protocol.decode_request(request, protocol.request_job_id(request))
    _, request = protocol.encode_request(record())
    for name, bad, message in (("model_name", "../x", "model name"), ("created", "inf", "created"),
                               ("targets", '[{"kind": "cpu", "triple": "x\\n"}]', "cpu target")):
        forged = {**request, name: bad}
        with pytest.raises(BadInputError, match=message):
            protocol.decode_request(forged, protocol.request_job_id(forged))
