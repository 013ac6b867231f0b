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
    """A float32 weight put in the store, how a CPU Gemm packs it, and the packed bytes (not put: the farm keeps
    the weight)."""
    weight = np.arange(256, dtype=np.float32).tobytes()
    derivation = recipes.Derivation(store.put(weight), len(weight), (4, 16, 16, 0), host_target())
    spec = BlobSpec(derivation.source, len(weight), host_target().id, derivation.panels)
    return derivation, pack_weights(spec, host_target(), weight)


def test_a_recipe_keeps_a_packed_weight_as_its_key_and_how_it_is_made_and_writes_the_local_artifact(
    tmp_path: Path,
) -> None:
    """The store holds the weight, not its packed copy: the recipe's entries name the weight, and the artifact's
    writer makes the packed member from it (what a download on a machine that didn't submit the model does)."""
    store = FileStore(tmp_path / "store")
    derivation, packed = _packing(store)
    members = {"weights/p.bin": recipes.derived(store, content_key(packed), len(packed), derivation), "lib.so": b"code"}
    key, entries = recipes.put_recipe(store, {"model": {"name": "m"}}, members, lambda keys: None)
    recipe = recipes.read_recipe(store.get(key))
    assert entries == recipe.entries == sorted([derivation.source, content_key(b"code")])
    assert recipe.derived == {content_key(packed): derivation} and not store.has(content_key(packed))
    assert members["weights/p.bin"].produce() == packed
    expected = artifact_bytes({"model": {"name": "m"}}, {"weights/p.bin": packed, "lib.so": b"code"})
    read: list[str] = []
    fetch = lambda k: read.append(k) or store.get(k)  # noqa: E731
    path = recipes.write_artifact_from(tmp_path / "m.farm", recipe, fetch)
    assert Path(path).read_bytes() == expected and sorted(read) == entries  # the packed one made from the weight
    read.clear()
    path = recipes.write_artifact_from(tmp_path / "m.farm", recipe, fetch, {content_key(packed): packed})
    assert Path(path).read_bytes() == expected and read == [content_key(b"code")]  # made ahead: taken as it is


def test_a_packed_weight_made_into_other_bytes_than_its_key_is_an_error_that_says_why(tmp_path: Path) -> None:
    """A client whose packing step isn't the workers' (another farm version) makes other bytes: never a member."""
    store = FileStore(tmp_path / "store")
    derivation, packed = _packing(store)
    key, _ = recipes.put_recipe(
        store, {}, {"p.bin": recipes.derived(store, "e" * 64, len(packed), derivation)}, lambda keys: None
    )
    with pytest.raises(
        ArtifactError,
        match=f"packed weight {'e' * 64}: packing weight {derivation.source} here "
        "gives other bytes .* the workers' version must be the same",
    ):
        recipes.write_artifact_from(tmp_path / "m.farm", recipes.read_recipe(store.get(key)), store.get)
    assert not (tmp_path / "m.farm").exists()


def test_derivations_in_a_link_plan_are_its_packed_weights_and_what_cant_be_read_is_left_out(tmp_path: Path) -> None:
    derivation, _ = _packing(FileStore(tmp_path / "store"))
    unit = {"kind": "blob", **derivation.to_json()}
    plain = {"kind": "blob", "spec": {**unit["spec"], "panels": None}, "target": unit["target"]}
    plan = {"units": {"a": unit, "b": {"kind": "kernel", "spec": {}}, "c": plain, "d": {"kind": "blob"}}}
    assert recipes.derivations_in(json.dumps(plan).encode()) == [derivation]
    assert recipes.derivations_in(b"not json") == recipes.derivations_in(b"{}") == []


@pytest.mark.parametrize(
    ("derived", "error"),
    [
        ({"x": {}}, "not keyed by sha256"),
        ({"a" * 64: {"spec": {"sha256": "b" * 64}}}, "malformed derivation"),
        ({"a" * 64: "packed"}, "malformed derivation"),
        ("all of them", "not keyed by sha256"),
    ],
)
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
