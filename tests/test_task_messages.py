"""The farm's task messages (farm/distributed/task_messages.py): task arguments round-trip through their encodings,
every decode refuses malformed input naming what is wrong, and every task has a queue."""

from __future__ import annotations

import json

import pytest

from farm.backends.llvm.target import CpuTarget
from farm.backends.opencl.target import OpenClTarget
from farm.build.units import CompileUnit
from farm.distributed import redis_keys, task_messages
from farm.distributed.task_messages import TASK_ARGS, Compile, Finish, Link, PlanJob, TaskName, Tune
from farm.errors import BadInputError
from farm.ir.graph import TensorInfo
from farm.ir.specs import BlobSpec, KernelSpec
from farm.ir.unit_kinds import UnitKind

JOB = "0123456789abcdef"
CPU = CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2,+fma")
DEVICE = OpenClTarget("fedcba9876543210")
SPEC = KernelSpec("Relu", "{}", (TensorInfo((1, 4), "float32"),), (TensorInfo((1, 4), "float32"),), None, "")


UNITS = {
    "kernel": CompileUnit(UnitKind.KERNEL, SPEC.__class__(**{**SPEC.__dict__, "target_id": CPU.id}), CPU),
    "blob": CompileUnit(UnitKind.BLOB, BlobSpec("e" * 64, 64, CPU.id), CPU),
    "clkernel": CompileUnit(UnitKind.CL_KERNEL, SPEC.__class__(**{**SPEC.__dict__, "target_id": "opencl"}), DEVICE),
}


@pytest.mark.parametrize(
    ("args", "task", "queue"),
    [
        (PlanJob(JOB), "farm.plan_job", "control"),
        (Finish(JOB), "farm.finish", "control"),
        (Link(JOB, CPU.id), "farm.link", "llvm"),
        (Compile(JOB, UNITS["kernel"]), "farm.compile_cpu_kernel", "llvm"),
        (Compile(JOB, UNITS["blob"]), "farm.pack_blob", "llvm"),
        (Compile(JOB, UNITS["clkernel"]), "farm.compile_cl_kernel", f"opencl.{DEVICE.fingerprint}"),
        (Tune(JOB, f"{CPU.id}/k", SPEC, CPU), "farm.tune_kernel", f"tune.{CPU.id}"),
    ],
    ids=lambda value: getattr(value, "task", None) and type(value).__name__,
)
def test_task_arguments_round_trip_as_json(args: task_messages.TaskArgs, task: str, queue: str) -> None:
    message = args.message()
    assert (message.task, message.queue) == (task, queue) and message.args[0] == JOB
    assert task_messages.decode(task, json.loads(json.dumps(message.args))) == args


def test_compile_arguments_name_the_unit_what_it_is_and_its_target_for_flower() -> None:
    assert Compile(JOB, UNITS["kernel"]).encode()[:4] == [JOB, UNITS["kernel"].name, "Relu", CPU.id]
    assert Compile(JOB, UNITS["blob"]).encode()[2] == "64 bytes"


@pytest.mark.parametrize(
    ("task", "args", "message"),
    [
        ("farm.rm_rf", [JOB], "unknown farm task"),
        ("farm.plan_job", [], "list of 1"),
        ("farm.plan_job", ["../x"], "not a job id"),
        ("farm.plan_job", JOB, "list of 1"),
        ("farm.link", [JOB, 7], "library must be a string"),
        ("farm.link", [JOB, ""], "1 to 256 characters"),
        ("farm.compile_cpu_kernel", [JOB, "u", "Relu", "t", {"kind": "shell"}], "not a compile unit"),
        (
            "farm.compile_cpu_kernel",
            [JOB, "u", "Relu", "t", {"kind": "kernel", "spec": {}, "target": CPU.to_json()}],
            "malformed spec",
        ),
        ("farm.tune_kernel", [JOB, "u", "Relu", "t", SPEC.to_json(), {"kind": "cpu"}], "target"),
    ],
)
def test_malformed_task_arguments_are_refused(task: str, args: object, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        task_messages.decode(task, args)


def test_every_task_has_arguments_and_a_queue() -> None:
    assert set(TASK_ARGS) == {task.value for task in TaskName}
    assert set(task_messages.FIXED_QUEUES) | {"farm.compile_cl_kernel", "farm.tune_kernel"} == set(TASK_ARGS)


def test_a_worker_consumes_control_llvm_its_cpus_tuning_and_its_devices() -> None:
    cpu = {"triple": CPU.triple, "cpu": CPU.cpu, "features": CPU.features}
    assert task_messages.worker_queues({"cpu": cpu, "opencl": [{"fingerprint": "ab" * 8}]}) == [
        "control",
        "llvm",
        f"tune.{CPU.id}",
        f"opencl.{'ab' * 8}",
    ]
    assert redis_keys.job_key(JOB) == f"farm:job:{JOB}" and redis_keys.phase_key(JOB, "compile").endswith(":compile")
