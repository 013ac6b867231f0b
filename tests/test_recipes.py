"""farm.distributed.recipes: an artifact kept as its manifest and members' keys, and how its packed weights are
made from the weights they pack."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from farm.artifact import artifact_bytes
from farm.backends.llvm.blobs import pack_weights
from farm.backends.llvm.target import host_target
from farm.distributed import recipes
from farm.errors import ArtifactError
from farm.ir.specs import BlobSpec
from farm.store import FileStore, content_key


def _packing(store: FileStore) -> tuple[recipes.Derivation, bytes]:
    """A float32 weight put in the store, how a CPU Gemm packs it, and the packed bytes (put too)."""
    weight = np.arange(256, dtype=np.float32).tobytes()
    derivation = recipes.Derivation(BlobSpec(store.put(weight), len(weight), host_target().id, (4, 16, 16, 0)),
                                     host_target())
    packed = pack_weights(derivation.spec, derivation.target, weight)
    store.put(packed)
    return derivation, packed


def test_a_recipe_says_how_each_packed_weight_is_made_and_writes_the_artifact_a_local_build_writes(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    derivation, packed = _packing(store)
    members = {"weights/p.bin": recipes.stored(store, content_key(packed), len(packed), derivation),
               "lib.so": b"code"}
    key, keys = recipes.put_recipe(store, {"model": {"name": "m"}}, members, lambda keys: None)
    recipe = recipes.read_recipe(store.get(key))
    assert keys == sorted([content_key(packed), content_key(b"code")])
    assert recipe.derived == {content_key(packed): derivation}
    assert recipe.derived[content_key(packed)].make(store.get(derivation.source)) == packed
    path = recipes.write_artifact_from(tmp_path / "m.farm", recipe, store.get)
    assert Path(path).read_bytes() == artifact_bytes({"model": {"name": "m"}},
                                                     {"weights/p.bin": packed, "lib.so": b"code"})


def test_a_packed_weight_read_back_from_the_cache_keeps_its_derivation(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    derivation, packed = _packing(store)
    member = recipes.known(packed, derivation)
    assert (member.key, member.size, member.produce(), member.derivation) == (
        content_key(packed), len(packed), packed, derivation)


def test_derivations_in_a_link_plan_are_its_packed_weights_and_what_cant_be_read_is_left_out(tmp_path: Path) -> None:
    derivation, _ = _packing(FileStore(tmp_path / "store"))
    unit = {"kind": "blob", **derivation.to_json()}
    plain = {"kind": "blob", "spec": {**derivation.spec.to_json(), "panels": None}, "target": unit["target"]}
    plan = {"units": {"a": unit, "b": {"kind": "kernel", "spec": {}}, "c": plain, "d": {"kind": "blob"}}}
    assert recipes.derivations_in(json.dumps(plan).encode()) == [derivation]
    assert recipes.derivations_in(b"not json") == recipes.derivations_in(b"{}") == []


@pytest.mark.parametrize(("derived", "error"), [
    ({"x": {}}, "not keyed by sha256"),
    ({"a" * 64: {"spec": {"sha256": "b" * 64}}}, "malformed derivation"),
    ({"a" * 64: "packed"}, "malformed derivation"),
    ("all of them", "not keyed by sha256"),
])
def test_a_recipe_with_a_malformed_derivation_is_refused(tmp_path: Path, derived: object, error: str) -> None:
    store = FileStore(tmp_path / "store")
    key, _ = recipes.put_recipe(store, {}, {"a.bin": b"a"}, lambda keys: None)
    text = json.loads(store.get(key))
    with pytest.raises(ArtifactError, match=error):
        recipes.read_recipe(json.dumps({**text, "derived": derived}).encode())


def test_a_recipe_that_says_how_to_make_a_member_it_doesnt_list_is_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    derivation, packed = _packing(store)
    key, _ = recipes.put_recipe(store, {}, {"a.bin": b"a"}, lambda keys: None)
    text = json.loads(store.get(key))
    with pytest.raises(ArtifactError, match="a member its manifest doesn't list"):
        recipes.read_recipe(json.dumps({**text, "derived": {content_key(packed): derivation.to_json()}}).encode())
