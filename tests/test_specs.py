"""KernelSpec and BlobSpec: content keys, JSON round trips."""

import hashlib

from farm.ir.graph import Activation, TensorInfo
from farm.ir.specs import CODEGEN_VERSION, BlobSpec, KernelSpec, canonical_json


def _spec(**changes) -> KernelSpec:
    fields = dict(
        op="Relu",
        attrs_json=canonical_json({}),
        inputs=(TensorInfo((1, 4)),),
        outputs=(TensorInfo((1, 4)),),
        activation=None,
        target_id="cpu-x",
    )
    fields.update(changes)
    return KernelSpec(**fields)


def test_equal_specs_share_a_key_and_symbol():
    assert _spec().key == _spec().key
    assert _spec().symbol == _spec().symbol and _spec().symbol.startswith("farm_k_")


def test_every_field_changes_the_key():
    base = _spec().key
    variants = [
        _spec(op="Sigmoid"),
        _spec(attrs_json=canonical_json({"a": 1})),
        _spec(inputs=(TensorInfo((1, 5)),)),
        _spec(activation=Activation("relu")),
        _spec(target_id="cpu-y"),
        _spec(variant_json=canonical_json({"rows": 6, "vectors": 4, "lanes": 16})),
    ]
    assert len({base, *(v.key for v in variants)}) == 1 + len(variants)


def test_kernel_spec_json_round_trip():
    spec = _spec(activation=Activation("clip", (0.0, 6.0)), attrs_json=canonical_json({"b": [1, 2], "a": 0.5}))
    assert KernelSpec.from_json(spec.to_json()) == spec


def test_a_variant_round_trips_and_an_untuned_spec_keeps_its_pre_tuning_form_and_key():
    tuned = _spec(variant_json=canonical_json({"rows": 6, "vectors": 4, "lanes": 16}))
    assert KernelSpec.from_json(tuned.to_json()) == tuned and tuned.variant == {"rows": 6, "vectors": 4, "lanes": 16}
    untuned = _spec()
    assert "variant" not in untuned.to_json() and untuned.variant is None
    before_tuning = {
        "op": "Relu",
        "attrs": {},
        "inputs": [[[1, 4], "float32"]],
        "outputs": [[[1, 4], "float32"]],
        "activation": None,
        "target": "cpu-x",
    }  # the JSON form every cached kernel was keyed by
    assert untuned.to_json() == before_tuning
    assert untuned.key == hashlib.sha256(canonical_json([CODEGEN_VERSION, before_tuning]).encode()).hexdigest()


def test_canonical_json_sorts_keys():
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'


def test_blob_spec_key_depends_on_target_but_symbol_does_not():
    a, b = BlobSpec("ab" * 32, 10, "cpu-x"), BlobSpec("ab" * 32, 10, "cpu-y")
    assert a.symbol == b.symbol and a.key != b.key
    assert a.to_json() == {"sha256": "ab" * 32, "bytes": 10, "target": "cpu-x"}


def test_blob_spec_panels_enter_key_symbol_and_json_only_when_set():
    plain, packed = BlobSpec("ab" * 32, 48, "cpu-x"), BlobSpec("ab" * 32, 48, "cpu-x", panels=(4, 4, 3))
    assert packed.key != plain.key and packed.symbol != plain.symbol
    assert packed.symbol.startswith(plain.symbol)
    assert "panels" not in plain.to_json() and packed.to_json()["panels"] == [4, 4, 3]
    assert BlobSpec.from_json(packed.to_json()) == packed and BlobSpec.from_json(plain.to_json()) == plain


def test_a_part_has_its_own_key_and_unit_but_the_kernels_symbol():
    """A kernel split into parts (farm.backends.llvm.kernel.kernel_parts): each part is a unit and cache entry of
    its own, every part serves the same kernel's symbol, and the first part's unit takes the whole kernel's name."""
    whole, first, second = _spec(), _spec(part=(0, 3)), _spec(part=(1, 3))
    assert len({whole.key, first.key, second.key}) == 3
    assert whole.symbol == first.symbol == second.symbol == first.whole.symbol and second.whole == whole
    assert (whole.unit_symbol, first.unit_symbol, second.unit_symbol) == (
        whole.symbol,
        whole.symbol,
        f"{whole.symbol}.part1",
    )
    assert KernelSpec.from_json(second.to_json()) == second and "part" not in whole.to_json()


def test_a_malformed_part_is_refused():
    import pytest

    for part in ([3, 3], [-1, 2], [0], "0/2", [0.0, 2]):
        with pytest.raises(ValueError, match="kernel part"):
            KernelSpec.from_json({**_spec().to_json(), "part": part})
