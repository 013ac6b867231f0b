"""Tests of farm.cli.schemas: every --json object has every key of its command's schema, and nothing else."""

from __future__ import annotations

import json

import pytest

from farm.cli import schemas


def test_a_document_has_every_key_of_its_schema_null_where_unknown():
    document = schemas.document("download", {"job_id": "j1"})
    assert document == {"command": "download", "schema": 1, "job_id": "j1", "artifact": None}


def test_a_failure_keeps_the_schema_and_adds_the_error():
    document = schemas.document("cancel", {"state": "failed", "error": "job j had already ended", "exit_status": 3})
    assert document == {
        "command": "cancel",
        "schema": 1,
        "job_id": None,
        "state": "failed",
        "error": "job j had already ended",
        "exit_status": 3,
    }


def test_a_key_outside_the_schema_is_a_bug_not_output():
    with pytest.raises(ValueError, match=r"farm run --json: keys \['stray'\] are not in its schema 1"):
        schemas.document("run", {"stray": 1})


def test_local_and_farm_builds_share_one_schema():
    version, keys = schemas.SCHEMAS["submit"]
    assert keys == schemas.BUILD_KEYS and {"compiled", "cached", "targets", "sizes"} <= set(keys)
    assert json.loads(schemas.dumps("submit", {"job_id": "j"}))["cached"] is None
