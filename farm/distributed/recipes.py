"""A farm artifact kept as a recipe: its manifest.json, each payload member's size, and how its packed weights are
made. Every other member is a store entry whose key is the sha256 the manifest lists for it (weights, libraries,
OpenCL binaries and sources), so the recipe names all the bytes without holding any.

Farm.finish puts a recipe in the store (a few KB to MB) instead of an artifact of all its members' bytes: finishing
a model of gigabytes of weights reads, copies and hashes none of them, and the store holds each weight once, not
again inside the artifact. The artifact file is made from the recipe only when it is downloaded
(`write_artifact_from`), streamed member by member through the tar writer that writes a local build's artifact, so
it is byte for byte the local build's. While a job keeps its artifact it pins the recipe and the entries it needs
(farm.distributed.pins).

A packed weight is a pure function of a weight blob (its "blob" unit's step, farm.backends.llvm.blobs), so the farm
keeps its key, not its bytes: the recipe says how each packed member is made (`Recipe.derived`), and the store
holds the weight it is made from (`Recipe.entries`: what the artifact pins and a reuse checks). Whoever writes the
artifact makes the member, checked by its sha256: the submitting machine from the model's own files, any other
from the weight it reads from the store (farm.distributed.uploads.local_first). No packed copy crosses Redis (a
cold BERT-base job's 340 MB of them used to be put once and read back once).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from farm import __version__
from farm.artifact import (
    MAX_MANIFEST_BYTES,
    LazyMember,
    Member,
    finished_manifest,
    manifest_from_text,
    write_finished_artifact,
)
from farm.backends.llvm.target import CpuTarget
from farm.backends.registry import target_from_json
from farm.errors import ArtifactError, BadInputError
from farm.ir.unit_kinds import UnitKind
from farm.store import Store, content_key, is_key

RECIPE_FORMAT = "farm-artifact-recipe/1"
MAX_RECIPE_BYTES = 2 * MAX_MANIFEST_BYTES
UNIT_COUNTS = ("kernels", "blobs")
"""A recipe holds the manifest (escaped as a JSON string) and a size per member."""


@dataclass(frozen=True)
class StoredMember(LazyMember):
    """A member that is a store entry already: `key` (its sha256) goes into the recipe without the bytes being read;
    `produce` reads them if the artifact is ever written from it."""

    key: str = ""
    derivation: Derivation | None = None
    """How the member is made from a weight blob, when it is a packed weight."""


def stored(store: Store, key: str, size: int) -> StoredMember:
    """The store entry `key` of `size` bytes as an artifact member."""
    return StoredMember(size, functools.partial(store.get, key), key=key)


def derived(store: Store, key: str, size: int, derivation: Derivation) -> StoredMember:
    """The packed weight of key `key` and `size` bytes that `derivation` makes from a weight in the store (which
    holds the weight, not the packed copy), as an artifact member."""
    return StoredMember(
        size, lambda: made_as_listed(key, derivation, store.get(derivation.source)), key=key, derivation=derivation
    )


@dataclass(frozen=True)
class Derivation:
    """A packed weight member as its "blob" unit makes it (farm.build.units): the float32 weight blob `source`
    (`nbytes` long) packed in `panels` (farm.ir.specs.BlobSpec.panels) for `target`'s kernels. It is made by the
    function a worker's step packs with (farm.backends.llvm.blobs.pack_weights); on a client install, which has no
    numpy, by the same layouts without it (farm.backends.llvm.panels): the sha256 check of every made member holds
    either to the worker's bytes."""

    source: str
    nbytes: int
    panels: tuple[int, ...]
    target: CpuTarget

    def make(self, source: bytes | memoryview) -> bytes:
        """The member's bytes from the weight blob's; ArtifactError when they can't be packed as the panels say."""
        if len(source) != self.nbytes:
            raise ArtifactError(f"weight {self.source}: {len(source)} bytes, the recipe says {self.nbytes}")
        try:
            return _packed(source, self.panels)
        except ValueError as error:
            raise ArtifactError(f"weight {self.source}: {error}") from None

    def to_json(self) -> dict[str, Any]:
        """The form of its unit's spec and target (farm.ir.specs.BlobSpec.to_json, CpuTarget.to_json)."""
        return {
            "spec": {
                "sha256": self.source,
                "bytes": self.nbytes,
                "target": self.target.id,
                "panels": list(self.panels),
            },
            "target": self.target.to_json(),
        }

    @classmethod
    def of(cls, spec: object, target: object) -> Derivation | None:
        """The derivation of a unit's output when it is a packed weight for a CPU (a BlobSpec with panels), else
        None."""
        from farm.ir.specs import BlobSpec  # where units are: a worker, a local build

        if not isinstance(spec, BlobSpec) or spec.panels is None or not isinstance(target, CpuTarget):
            return None
        return cls(spec.data_sha256, spec.nbytes, spec.panels, target)

    @classmethod
    def from_json(cls, data: Any) -> Derivation:
        """A derivation read back from a recipe or a link plan; ValueError when it is not one of a packed weight."""
        try:
            spec, target = data["spec"], target_from_json(data["target"])
            source, nbytes, panels = spec["sha256"], spec["bytes"], tuple(spec["panels"])
        except (KeyError, TypeError, ValueError, BadInputError) as error:
            raise ValueError(f"a malformed derivation: {error!r}") from None
        if not (
            is_key(source)
            and type(nbytes) is int
            and nbytes >= 0
            and isinstance(target, CpuTarget)
            and spec.get("target") == target.id
            and len(panels) in (3, 4, 5)
            and all(type(value) is int and value >= 0 for value in panels)
        ):
            raise ValueError("a derivation that packs no weight for a CPU")
        return cls(source, nbytes, panels, target)


def _packed(source: bytes | memoryview, panels: tuple[int, ...]) -> bytes:
    """The weight packed by the function a worker's step packs with (farm.backends.llvm.packing: numpy, no LLVM),
    or without numpy on a client install (farm.backends.llvm.panels: the same layouts)."""
    try:
        import numpy as np

        from farm.backends.llvm.packing import pack_operand
    except ModuleNotFoundError:
        from farm.backends.llvm.panels import pack

        return pack(source, panels)
    return pack_operand(np.frombuffer(source, dtype=np.float32), panels).tobytes()


@dataclass(frozen=True)
class Recipe:
    """A recipe read back: manifest.json's bytes and each payload member's size; its keys are the manifest's
    sha256s."""

    manifest_text: bytes
    manifest: dict[str, Any]
    sizes: dict[str, int]
    units: dict[str, int] = field(default_factory=dict)
    """The build's unit counts ("kernels", "blobs"), so that a job reusing the artifact reports what it holds;
    empty in a recipe put without them."""
    derived: dict[str, Derivation] = field(default_factory=dict)
    """How each packed weight member is made, by its key (empty in a recipe put without them)."""

    @property
    def entries(self) -> list[str]:
        """The store entries the artifact needs: its members', the weights its packed ones are made from instead
        of theirs."""
        return _entries(self.keys.values(), self.derived)

    @property
    def keys(self) -> dict[str, str]:
        """Each payload member's store key, by path."""
        return dict(self.manifest["members"])


def put_recipe(
    store: Store,
    manifest: dict[str, Any],
    members: Mapping[str, Member],
    pin: Callable[[list[str]], None],
    units: Mapping[str, int] | None = None,
) -> tuple[str, list[str]]:
    """Put the recipe of the artifact that `manifest` and `members` make, and return its key and the store entries
    it needs (Recipe.entries). Members that are bytes are put first (most are entries already, which the store
    doesn't write again); `pin(keys)` is called with every key before anything is put, so that no eviction falls in
    between."""
    unstored = {
        path: member.produce() if isinstance(member, LazyMember) else member
        for path, member in members.items()
        if not isinstance(member, StoredMember)
    }
    keys = {
        path: member.key if isinstance(member, StoredMember) else content_key(unstored[path])
        for path, member in members.items()
    }
    sizes = {
        path: member.size if isinstance(member, StoredMember) else memoryview(unstored[path]).nbytes
        for path, member in members.items()
    }
    derived = {
        member.key: member.derivation
        for member in members.values()
        if isinstance(member, StoredMember) and member.derivation is not None
    }
    text = finished_manifest(manifest, keys)
    recipe = json.dumps(
        {
            "format": RECIPE_FORMAT,
            "manifest": text.decode("utf-8"),
            "sizes": sizes,
            **({"units": dict(units)} if units else {}),
            **({"derived": {key: d.to_json() for key, d in derived.items()}} if derived else {}),
        },
        sort_keys=True,
    ).encode()
    entries = _entries(keys.values(), derived)
    pin([content_key(recipe), *entries])
    for data in unstored.values():
        store.put(data)
    return store.put(recipe), entries


def _entries(keys: Iterable[str], derived: Mapping[str, Derivation]) -> list[str]:
    return sorted({derived[key].source if key in derived else key for key in keys})


def derivations_in(link_plan: bytes) -> list[Derivation]:
    """The packed weights a job's link plan (farm.build.assembly.link_plan) has units for, as derivations (a unit
    that can't be read as one is left out: making it ahead is only a head start)."""
    try:
        units = json.loads(link_plan)["units"]
        blob_units = [
            unit for unit in units.values() if isinstance(unit, dict) and unit.get("kind") == UnitKind.BLOB.value
        ]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return []
    found = []
    for unit in blob_units:
        with contextlib.suppress(ValueError):
            found.append(Derivation.from_json(unit))
    return found


def read_recipe(data: bytes, where: str = "an artifact recipe in the store") -> Recipe:
    """A recipe's bytes decoded and checked: ArtifactError when they are not one (an artifact a farm of an older
    version put under the same ref, say)."""
    try:
        if len(data) > MAX_RECIPE_BYTES:
            raise ValueError(f"{len(data)} bytes, over {MAX_RECIPE_BYTES}")
        recipe = json.loads(data)
        if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
            raise ValueError(f"not a {RECIPE_FORMAT}")
        text, sizes, units = recipe["manifest"].encode("utf-8"), recipe["sizes"], recipe.get("units", {})
        if not isinstance(units, dict) or not all(
            key in UNIT_COUNTS and type(count) is int and count >= 0 for key, count in units.items()
        ):
            raise ValueError(f"its units are not counts of {', '.join(UNIT_COUNTS)}")
        derived = _derivations(recipe.get("derived", {}))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as error:
        raise ArtifactError(f"{where} is not an artifact recipe: {error}") from None
    manifest = manifest_from_text(text, where)
    if (
        not isinstance(sizes, dict)
        or sorted(sizes) != sorted(manifest["members"])
        or not all(type(size) is int and size >= 0 for size in sizes.values())
    ):
        raise ArtifactError(f"{where}: its sizes are not one per member of its manifest")
    if not set(derived) <= set(manifest["members"].values()):
        raise ArtifactError(f"{where}: it says how to make a member its manifest doesn't list")
    return Recipe(text, manifest, sizes, units, derived)


def _derivations(data: Any) -> dict[str, Derivation]:
    if not isinstance(data, dict) or not all(isinstance(key, str) and is_key(key) for key in data):
        raise ValueError("its derivations are not keyed by sha256")
    return {key: Derivation.from_json(value) for key, value in data.items()}


def write_artifact_from(
    path: str | os.PathLike[str], recipe: Recipe, read: Callable[[str], bytes], made: dict[str, bytes] | None = None
) -> str:
    """Write at `path` (atomically) the artifact `recipe` describes, reading each member by its key with `read`
    (which checks the bytes against it, as Store.get and uploads.local_first do, so the archive doesn't hash them
    again), and making each packed one from its weight as `read` gives it, checked (or taking it from `made`, by
    its key, when it was made ahead and checked so); returns the path. The member after the one being written is read meanwhile on a thread (the archive
    takes members in name order), so that fetching from the store and writing the file overlap; two members at most
    are in memory."""
    names = sorted(recipe.sizes)
    ready = made if made is not None else {}

    def member(key: str) -> bytes:
        derivation = recipe.derived.get(key)
        if derivation is None:
            return read(key)
        return ready.pop(key, None) or made_as_listed(key, derivation, read(derivation.source))

    with ThreadPoolExecutor(1, thread_name_prefix="farm-download") as pool:
        ahead: dict[int, Future[bytes]] = {}

        def produce(index: int) -> bytes:
            fetch = ahead.pop(index, None) or pool.submit(member, recipe.keys[names[index]])
            if index + 1 < len(names):
                ahead[index + 1] = pool.submit(member, recipe.keys[names[index + 1]])
            return fetch.result()

        members = {
            name: LazyMember(recipe.sizes[name], functools.partial(produce, index), recipe.keys[name])
            for index, name in enumerate(names)
        }
        return write_finished_artifact(path, recipe.manifest_text, members)


def made_as_listed(key: str, derivation: Derivation, source: bytes | memoryview) -> bytes:
    """The packed weight `key` made from its weight's bytes; ArtifactError when they hash to another key (this
    machine's packing step is not the workers')."""
    data = derivation.make(source)
    if content_key(data) != key:
        raise ArtifactError(
            f"packed weight {key}: packing weight {derivation.source} here gives other bytes (farm "
            f"{__version__} here: the workers' version must be the same)"
        )
    return data


def intact(store: Store, keys: Iterable[str]) -> bool:
    """Whether every one of `keys` is in the store whole, so that an artifact reused from its recipe can be
    downloaded. Lengths are checked, not bytes (farm.store.Store.incomplete): reading a big model's members back would
    make its reuse cost more than its download. A member whose bytes are damaged is found by the sha256 check of the
    download that reads it, which asks the workers to drop it (farm.distributed.redis_keys.REPAIR_KEY), so that the next
    submission builds it again."""
    return not store.incomplete(keys)
