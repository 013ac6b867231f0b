"""The farm's job record (farm/distributed/job_record.py): records and requests round-trip through their encodings,
and every decode refuses malformed input naming what is wrong."""

from __future__ import annotations

import json

import pytest

from farm.backends.llvm.target import CpuTarget
from farm.backends.opencl.target import OpenClTarget
from farm.distributed import job_record, redis_keys
from farm.distributed.job_record import JobRecord, JobState, encode_fields, encode_record
from farm.errors import BadInputError

CPU = CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2,+fma")
DEVICE = OpenClTarget("fedcba9876543210")


def record(**fields: object) -> JobRecord:
    return JobRecord(JobState.QUEUED, "a" * 64, "model", "b" * 64, [CPU, DEVICE], created=1.5, updated=2.5, **fields)


def test_a_record_round_trips_through_its_hash_fields() -> None:
    full = record(
        no_cache=True,
        tune=True,
        total=13,
        kernels=7,
        blobs=6,
        targets_total=1,
        link_plan_key="c" * 64,
        tune_units=["a/k"],
        tune_errors={"a/k": "boom"},
        libraries={CPU.id: "d" * 64},
        exit_status=2,
        lost_workers={f"w2@host#{'e' * 32}": 3},
    )
    fields = encode_record(full)
    assert all(isinstance(value, str) for value in fields.values())
    assert fields["no_cache"] == "True" and fields[f"library:{CPU.id}"] == "d" * 64 and "finished" not in fields
    assert fields[f"lost_worker:w2@host#{'e' * 32}"] == "3"
    assert JobRecord.decode(fields) == full


def test_partial_updates_encode_only_their_fields() -> None:
    assert encode_fields(state=JobState.DONE, total=0, cached=True) == {"state": "done", "total": "0", "cached": "True"}
    with pytest.raises(ValueError, match="no job record field 'plan_key'"):
        encode_fields(plan_key="x")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("state", "exploded", "'state'"),
        ("targets", json.dumps([{"kind": "tpu"}]), "unknown target kind 'tpu'"),
        ("targets", json.dumps([{"kind": "cpu", "triple": 'x86_64"; ret', "cpu": "a", "features": ""}]), "triple"),
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
    ],
)
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


def test_a_request_round_trips_to_a_queued_record_with_its_graph_key_and_model_sha256() -> None:
    """The submitter stages a split graph (model_key) and names its model file's sha256 apart: both travel."""
    job_id, request = job_record.encode_request(record(no_cache=True, submitted_from="ci-runner"))
    assert redis_keys.check_job_id(job_id) == job_id and set(request) == {*job_record.REQUEST_FIELDS, "nonce"}
    decoded = job_record.decode_request(request, job_id)
    assert decoded.state == JobState.QUEUED and decoded.model_key == "a" * 64 and decoded.model_sha256 == "b" * 64
    assert decoded.targets == [CPU, DEVICE] and decoded.no_cache and decoded.submitted_from == "ci-runner"
    assert job_record.encode_request(record())[0] != job_record.encode_request(record())[0]  # the nonce differs


REQUEST_FORGERIES = {
    "a field only the farm sets": ({"artifact_key": "c" * 64}, "fields it may not set: artifact_key"),
    "a state": ({"state": "done"}, "fields it may not set: state"),
    "a rewritten target": ({"targets": json.dumps([CPU.to_json()])}, "not the one its id was made from"),
    "a rewritten model": ({"model_sha256": "c" * 64}, "not the one its id was made from"),
    "a malformed nonce": ({"nonce": "x"}, "not the one its id was made from"),
}


@pytest.mark.parametrize(("changes", "message"), REQUEST_FORGERIES.values(), ids=REQUEST_FORGERIES.keys())
def test_a_forged_request_is_refused_naming_why(changes: dict[str, str], message: str) -> None:
    job_id, request = job_record.encode_request(record())
    with pytest.raises(BadInputError, match=message):
        job_record.decode_request({**request, **changes}, job_id)


def test_a_request_with_a_field_missing_or_malformed_is_refused_even_when_its_id_matches() -> None:
    _, request = job_record.encode_request(record())
    del request["targets"]
    with pytest.raises(BadInputError, match="lacks targets"):
        job_record.decode_request(request, job_record.request_job_id(request))
    _, request = job_record.encode_request(record())
    for name, bad, message in (
        ("model_name", "../x", "model name"),
        ("created", "inf", "created"),
        ("targets", '[{"kind": "cpu", "triple": "x\\n"}]', "cpu target"),
    ):
        forged = {**request, name: bad}
        with pytest.raises(BadInputError, match=message):
            job_record.decode_request(forged, job_record.request_job_id(forged))
