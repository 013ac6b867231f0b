"""The tuning database (farm/tuning/database.py): records keyed by CPU class and kernel (target and variant left
out), what a record holds, and that an unusable record counts as none."""

from __future__ import annotations

import json
from pathlib import Path

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.store import FileStore
from farm.tuning.database import PIN_OWNER, db_ref, lookup, record, tuning_key
from farm.tuning.space import candidate_variants, variant_spec
from tests.test_tuning_space import AARCH64, CASES, HOST, build_with, kernel_entries, save, tunable_specs


def test_a_record_is_found_by_cpu_class_and_kernel_whatever_the_variant(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    spec = tunable_specs(save(CASES["gemm"], tmp_path))[0]
    chosen = candidate_variants(HOST)[1]
    key = record(store, spec, HOST, {"variant": chosen.to_json()})
    assert db_ref(spec, HOST.id) == f"tune:{HOST.id}:{tuning_key(spec)}" and store.get_ref(db_ref(spec, HOST.id)) == key
    assert tuning_key(variant_spec(spec, HOST, chosen)) == tuning_key(spec)
    assert lookup(store, variant_spec(spec, HOST, chosen), HOST.id) == chosen
    assert lookup(store, spec, AARCH64.id) is None  # another CPU class has no record
    entry = json.loads(store.get(key))
    assert (entry["kernel"], entry["op"], entry["target"]) == (tuning_key(spec), spec.op, HOST.to_json())
    assert entry["farm_version"] and GemmBlocking.from_json(entry["variant"]) == chosen


def test_a_corrupt_record_counts_as_none(tmp_path: Path) -> None:
    path = save(CASES["matmul"], tmp_path)
    store = FileStore(tmp_path / "store")
    spec = tunable_specs(path)[0]
    store.set_ref(db_ref(spec, HOST.id), store.put(b'{"variant": {"rows": -1}}'))
    assert lookup(store, spec, HOST.id) is None
    assert [e["variant_source"] for e in kernel_entries(build_with(path, tmp_path / "out", store))] == ["default"]


def test_records_are_pinned_so_eviction_never_takes_one_and_a_replaced_one_ages_out(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    spec = tunable_specs(save(CASES["gemm"], tmp_path))[0]
    first, second = candidate_variants(HOST)[1:3]
    old = record(store, spec, HOST, {"variant": first.to_json()})
    store.set_max_bytes(1)
    store.evict()
    assert lookup(store, spec, HOST.id) == first and store.stats().pin_owners == [PIN_OWNER]
    new = record(store, spec, HOST, {"variant": second.to_json()})  # a retune
    store.evict()
    assert not store.has(old) and store.has(new) and lookup(store, spec, HOST.id) == second


def test_a_missing_record_counts_as_none(tmp_path: Path) -> None:
    """An entry gone from the store (deleted as corrupt) is a cache miss: the default variant, as with no record."""
    store = FileStore(tmp_path / "store")
    spec = tunable_specs(save(CASES["gemm"], tmp_path))[0]
    store.delete(record(store, spec, HOST, {"variant": candidate_variants(HOST)[1].to_json()}))
    assert lookup(store, spec, HOST.id) is None


def test_a_record_that_is_not_replaced_stays_and_the_one_there_is_returned(tmp_path: Path) -> None:
    """A submitter's --tune on a shared farm only adds records: a kernel timed by two jobs at once keeps the first
    record; only a retune (replace) changes it."""
    store = FileStore(tmp_path / "store")
    spec = tunable_specs(save(CASES["gemm"], tmp_path))[0]
    first, second = candidate_variants(HOST)[1:3]
    kept = record(store, spec, HOST, {"variant": first.to_json()}, replace=False)
    assert record(store, spec, HOST, {"variant": second.to_json()}, replace=False) == kept
    assert lookup(store, spec, HOST.id) == first
    record(store, spec, HOST, {"variant": second.to_json()})
    assert lookup(store, spec, HOST.id) == second
