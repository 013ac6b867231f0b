"""The artifact file: one uncompressed POSIX tar holding `manifest.json` and the payload members.

The bytes are deterministic (members sorted by path, zeroed metadata, ustar headers without pax timestamps) so that
the same build gives the same file, and every payload member's sha256 is in the manifest, whose own sha256 is the
member `manifest.sha256`, so that a reader can refuse a tampered or truncated artifact before it loads anything from
it. The manifest is parsed with bounds (size, nesting depth, digits of a number) so that a hostile one is refused
with an ArtifactError rather than a RecursionError or a ValueError. Reading never extracts: members are read into
memory by offset, after their path and type have been checked.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import json
import operator
import os
import posixpath
import re
import tarfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Union

from farm.atomic import stream_atomically
from farm.errors import ArtifactError

FORMAT_VERSION = 6
"""6: each CPU target lists `requires`, every feature its code may use; a runtime that can't check them refuses the
artifact by its version rather than running code its host may lack."""
SIZED_FORMAT_VERSION = 7
"""The format of an artifact holding several sizes (a `sizes` list, see size_manifests); a runtime that reads only
FORMAT_VERSION refuses it by its version rather than by a missing field."""
COMMON_FIELDS = ("format_version", "farm_version", "toolchain", "model", "members")
"""The manifest fields that an artifact of several sizes keeps once, at the top; every other field is a size's."""
MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest.sha256"
SIGNATURE = "manifest.sig"
_RESERVED = (MANIFEST, MANIFEST_DIGEST, SIGNATURE)
_MAX_SIGNATURE_BYTES = 1024
# Bounds on manifest.json before it is parsed: a real one is some 10-110 KB (the examples) deep 6 levels, with no
# number over 20 digits; past these a manifest is hostile (json would recurse into a RecursionError or build
# 5000-digit ints).
MAX_MANIFEST_BYTES = 16 << 20
MAX_MANIFEST_DEPTH = 32
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
"""Each bracket as twice the brackets it opens, so that the nesting after k brackets is their sum less k."""
MAX_NUMBER_CHARS = 40
_END_OF_ARCHIVE = b"\0" * (2 * tarfile.BLOCKSIZE)
_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a fifo",
    tarfile.DIRTYPE: "a directory",
}


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _path_problem(name: str) -> str | None:
    """Why `name` can't be a member path (None when it can): it must stay inside the artifact's folder once joined."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if name.startswith("/") or "\\" in name:
        return "is absolute or uses backslashes"
    if ".." in name.split("/"):
        return "contains '..'"
    if posixpath.normpath(name) != name or name == ".":
        return "is not a normalised relative path"
    return None


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    """A regular-file header with every varying field (time, owner, mode) fixed, so that the bytes are reproducible."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


@dataclass(frozen=True)
class LazyMember:
    """A member whose bytes are made only as the archive is written, then dropped: a build's packed weights (each a
    pure step's output) are never all held at once, so a model of gigabytes is written in the memory of its
    largest weight. `size` is what `produce` must return (the tar header comes first). `checked`: the sha256 that
    `produce` already checked its bytes against (a read of the farm's store, a made packed weight), which the
    archive takes instead of hashing them again."""

    size: int
    produce: Callable[[], bytes]
    checked: str = ""


Member = Union[bytes, bytearray, memoryview, LazyMember]


def _member_bytes(name: str, data: Member) -> bytes | bytearray | memoryview:
    if not isinstance(data, LazyMember):
        return data
    made = data.produce()
    if memoryview(made).nbytes != data.size:
        raise ValueError(f"artifact member {name!r} was made with {len(made)} bytes, {data.size} were announced")
    return made


class _BufferReader(io.RawIOBase):
    """A file over a buffer (a numpy array's weights, say) that hands out views of it: tarfile writes a member in
    chunks of COPY_BYTES, each straight from the buffer, so the member is never copied."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view, self._at = memoryview(data).cast("B"), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> memoryview:  # views, not copies
        end = len(self._view) if size < 0 else min(len(self._view), self._at + size)
        chunk, self._at = self._view[self._at : end], end
        return chunk


COPY_BYTES = 1 << 30
"""The pieces a member is written in: each a view of the member, never a copy, so as big as one write may be.
tarfile's default, 16 KiB, took 27,000 writes for BERT-base's weights. And a file system with large folios (ext4
under Linux 6.18, say) caches a big write's whole 2 MB stretches as 2 MB folios, which every map of the artifact then
maps as huge pages (farm.backends.llvm.loader.map_weights): written 1 MiB at a time, VGG-19's 411 MB fully
connected layer sat on 4 KB pages and took 38-47 ms a run instead of 29-31 (a page walk per 4 KB page). The price
is paid where the OS must first back the 2 MB folios (a VM's untouched memory: docs/architecture.md, Weights)."""


def _add_file(tar: tarfile.TarFile, name: str, data: bytes | bytearray | memoryview) -> None:
    reader: Any = _BufferReader(data)  # views where tarfile's stub says bytes: it only writes them
    tar.addfile(_tar_info(name, memoryview(data).nbytes), reader)


def _write_tar(
    file: BinaryIO,
    payload: Mapping[str, Member],
    manifest: dict[str, Any] | None = None,
    reserved: Mapping[str, bytes] | None = None,
) -> dict[str, str]:
    """The archive into `file`, ustar format (so that tarfile never adds pax headers carrying timestamps): the
    payload members in name order, each hashed as it is written (a LazyMember made just then), then the manifest
    completed with those sha256s and its digest (or, when re-writing a signed artifact, the `reserved` files as
    given). The manifest comes last so that no member needs to exist before it is written. Returns the payload
    members' sha256s by path."""
    digests = {}
    with tarfile.TarFile(
        fileobj=file, mode="w", format=tarfile.USTAR_FORMAT, encoding="utf-8", copybufsize=COPY_BYTES
    ) as tar:
        for name in sorted(payload):
            data = _member_bytes(name, payload[name])
            member = payload[name]
            checked = member.checked if isinstance(member, LazyMember) else ""
            digests[name] = checked or _sha256(memoryview(data).cast("B"))
            _add_file(tar, name, data)
            del data
        files = dict(reserved or {}) if manifest is None else _manifest_files(manifest, digests)
        for name in _RESERVED:
            if name in files:
                _add_file(tar, name, files[name])
    return digests


def write_artifact(path: str | os.PathLike[str], manifest: dict[str, Any], members: Mapping[str, Member]) -> str:
    """Write the artifact at `path` atomically and return the path. The archive streams into the file: a model of
    gigabytes is never copied into an archive in memory (artifact_bytes's bytes are the same), and LazyMembers are
    made one at a time as they are written.

    Bad member paths raise ValueError before anything is written; any failure leaves neither the artifact nor a
    temporary file behind, and an existing artifact at `path` stays as it was.
    """
    _check_contents(manifest, members)
    path = os.fspath(path)
    stream_atomically(path, lambda file: _write_tar(file, members, manifest), fsync=True)
    return path


def artifact_bytes(manifest: dict[str, Any], members: Mapping[str, Member]) -> bytes:
    """The artifact file's bytes. The manifest gets `"members": {path: sha256}` for every payload member and
    `format_version` when it has none."""
    _check_contents(manifest, members)
    buffer = io.BytesIO()
    _write_tar(buffer, members, manifest)
    return buffer.getvalue()


def finished_manifest(manifest: dict[str, Any], digests: Mapping[str, str]) -> bytes:
    """The manifest.json an artifact of payload members with these sha256s (path -> digest) holds, as
    write_artifact would write it: what a farm keeps of an artifact besides its members' store keys, whose sha256s
    they are (farm.distributed.recipes), so that it is finished without reading or hashing a member."""
    _check_contents(manifest, digests)
    return _manifest_files(manifest, dict(digests))[MANIFEST]


def write_finished_artifact(path: str | os.PathLike[str], manifest_text: bytes, members: Mapping[str, Member]) -> str:
    """Write at `path` (atomically) the artifact whose manifest.json is `manifest_text` (finished_manifest's) and
    whose payload is `members`: the very bytes write_artifact writes from the manifest it was made of. Each member
    is hashed as it is written; ArtifactError, with nothing written, when one differs from the manifest's sha256."""
    path = os.fspath(path)
    listed = _parse_manifest(path, manifest_text)["members"]
    if sorted(listed) != sorted(members):
        raise ArtifactError(f"{path}: the members given are not those {MANIFEST} lists")
    reserved = {MANIFEST: manifest_text, MANIFEST_DIGEST: f"{_sha256(manifest_text)}\n".encode()}

    def write(file: BinaryIO) -> None:
        digests = _write_tar(file, members, reserved=reserved)
        wrong = sorted(name for name, digest in digests.items() if digest != listed[name])
        if wrong:
            raise ArtifactError(f"{path}: member {wrong[0]!r} differs from the sha256 {MANIFEST} lists")

    stream_atomically(path, write, fsync=True)
    return path


def manifest_from_text(text: bytes, where: str) -> dict[str, Any]:
    """A manifest.json's bytes decoded and checked as open_artifact checks an artifact's (`where` names it)."""
    return _parse_manifest(where, text)


def _check_contents(manifest: dict[str, Any], members: Mapping[str, object]) -> None:
    """ValueError for a bad member path or format version, before anything is written (`members`: by path, their
    bytes or their sha256s)."""
    for name in members:
        problem = _path_problem(name)
        if problem or name in _RESERVED:
            raise ValueError(f"artifact member path {name!r} {problem or 'is reserved for the manifest'}")
    expected = format_version_of(manifest)
    if manifest.get("format_version", expected) != expected:
        raise ValueError(
            f"manifest format_version is {manifest['format_version']!r}, this farm writes {expected} for it"
        )


def format_version_of(manifest: dict[str, Any]) -> int:
    """The format version a manifest has: SIZED_FORMAT_VERSION with a `sizes` list, else FORMAT_VERSION."""
    return SIZED_FORMAT_VERSION if "sizes" in manifest else FORMAT_VERSION


def size_manifests(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Each size's manifest as one artifact of that size alone would hold it (its fields beside the COMMON_FIELDS,
    and `shapes`, its pins, where it has any); a manifest without `sizes` is its one size. The runtime checks what
    it reads of each (farm.runtime.manifest.check_sizes)."""
    sizes = manifest.get("sizes")
    if not isinstance(sizes, list):
        return [manifest]
    common = {key: manifest[key] for key in COMMON_FIELDS if key in manifest}
    return [{**size, **common} for size in sizes if isinstance(size, dict)]


def _manifest_files(manifest: dict[str, Any], digests: dict[str, str]) -> dict[str, bytes]:
    """manifest.json completed with every payload member's sha256, and manifest.sha256."""
    full = {"format_version": format_version_of(manifest), **manifest, "members": digests}
    text = (json.dumps(full, sort_keys=True, indent=2) + "\n").encode("utf-8")
    return {MANIFEST: text, MANIFEST_DIGEST: f"{_sha256(text)}\n".encode()}


class Artifact:
    """An opened artifact whose layout has been checked; member bytes are verified each time they are read."""

    def __init__(
        self,
        path: str,
        manifest: dict[str, Any],
        index: dict[str, tuple[int, int]],
        manifest_text: bytes = b"",
        signature: bytes | None = None,
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.manifest_text, self.signature = manifest_text, signature
        self._index = index
        self._hashes = dict(manifest["members"])

    def read_member(self, name: str) -> bytes:
        """The bytes of payload member `name`, after checking them against the manifest's sha256."""
        offset, size = self._place(name)
        with open(self.path, "rb") as file:
            file.seek(offset)
            data = file.read(size)
        if len(data) != size:
            raise self._truncated(name, len(data), size)
        self._check_digest(name, _sha256(data))
        return data

    def copy_member(self, name: str, file: BinaryIO, chunk: int = 16 << 20) -> None:
        """Write payload member `name` to `file` a chunk at a time, hashing as it goes: ArtifactError when its bytes
        differ from the manifest's sha256 (the caller discards what was written). A library of gigabytes is never
        held in memory."""
        offset, size = self._place(name)
        digest, left = hashlib.sha256(), size
        with open(self.path, "rb") as source:
            source.seek(offset)
            while left:
                block = source.read(min(chunk, left))
                if not block:
                    raise self._truncated(name, size - left, size)
                digest.update(block)
                file.write(block)
                left -= len(block)
        self._check_digest(name, digest.hexdigest())

    def member_sha256(self, name: str) -> str:
        """The sha256 the manifest lists for payload member `name` (KeyError when it lists none)."""
        return self._hashes[name]

    def member_size(self, name: str) -> int:
        """The bytes of payload member `name` as the archive holds it (not read)."""
        return self._place(name)[1]

    def member_place(self, name: str) -> tuple[int, int]:
        """(offset, size) of payload member `name` in the artifact file (a tar: offsets are multiples of 512), for a
        reader that maps the file (the runtime's weights) after checking the member once."""
        return self._place(name)

    def _place(self, name: str) -> tuple[int, int]:
        """(offset, size) of a listed payload member in the archive."""
        if name not in self._hashes:
            raise ArtifactError(f"{self.path}: the manifest lists no member {name!r}")
        return self._index[name]

    def _truncated(self, name: str, found: int, size: int) -> ArtifactError:
        return ArtifactError(f"{self.path}: member {name!r} is truncated ({found} of {size} bytes)")

    def _check_digest(self, name: str, sha256: str) -> None:
        if sha256 != self._hashes[name]:
            raise ArtifactError(
                f"{self.path}: member {name!r} was tampered with (its sha256 differs from the manifest)"
            )

    def verify(self, skip: Collection[str] = ()) -> None:
        """Read and check every payload member (but those in `skip`, which the caller reads and so checks itself),
        so that a damaged artifact fails now rather than at first use."""
        for name in sorted(set(self._hashes) - set(skip)):
            self.read_member(name)


def open_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Open an artifact, checking its tar structure, member paths and types and its manifest (not member hashes)."""
    path = os.fspath(path)
    index = _index(path)
    if MANIFEST not in index:
        raise ArtifactError(f"{path}: the artifact has no {MANIFEST}")
    if MANIFEST_DIGEST not in index:
        raise ArtifactError(f"{path}: the artifact has no {MANIFEST_DIGEST} (built by an older farm: rebuild it)")
    if index[MANIFEST][1] > MAX_MANIFEST_BYTES or index[MANIFEST_DIGEST][1] > 100:
        raise ArtifactError(f"{path}: {MANIFEST} is over {MAX_MANIFEST_BYTES} bytes; refused")
    text = _read_range(path, *index.pop(MANIFEST))
    _check_digest(path, text, _read_range(path, *index.pop(MANIFEST_DIGEST)))
    signature = _read_signature(path, index.pop(SIGNATURE, None))
    manifest = _parse_manifest(path, text)
    listed = manifest["members"]
    for name in sorted(listed):
        if name not in index:
            raise ArtifactError(f"{path}: the manifest lists member {name!r} but the artifact lacks it")
    for name in sorted(index):
        if name not in listed:
            raise ArtifactError(f"{path}: member {name!r} is not listed in the manifest")
    return Artifact(path, manifest, index, text, signature)


def _read_signature(path: str, place: tuple[int, int] | None) -> bytes | None:
    if place is None:
        return None
    if place[1] > _MAX_SIGNATURE_BYTES:
        raise ArtifactError(f"{path}: {SIGNATURE} is over {_MAX_SIGNATURE_BYTES} bytes; refused")
    return _read_range(path, *place)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a structurally sound artifact."""
    return open_artifact(path).manifest


def verify(path: str | os.PathLike[str]) -> Artifact:
    """Open the artifact and check every member's sha256 eagerly; return it for reading."""
    artifact = open_artifact(path)
    artifact.verify()
    return artifact


def _index(path: str) -> dict[str, tuple[int, int]]:
    """Map each member path to its (data offset, size), refusing anything that could escape or that is cut short."""
    try:
        size = os.path.getsize(path)
        with tarfile.open(path, mode="r:") as tar:
            infos = tar.getmembers()
            end = tar.offset
    except (tarfile.TarError, EOFError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{path}: not a valid artifact (not an uncompressed tar, or truncated): {error}") from None
    except OSError as error:
        raise ArtifactError(f"{path}: can't read the artifact: {error}") from None
    if _read_range(path, end, len(_END_OF_ARCHIVE)) != _END_OF_ARCHIVE:
        raise ArtifactError(
            f"{path}: the artifact is truncated or damaged (no end-of-archive marker after its members)"
        )
    index: dict[str, tuple[int, int]] = {}
    for info in infos:
        _check_member(path, info)
        if info.name in index:
            raise ArtifactError(f"{path}: member {info.name!r} appears twice")
        if info.offset_data + info.size > size:
            raise ArtifactError(f"{path}: member {info.name!r} is truncated")
        index[info.name] = (info.offset_data, info.size)
    return index


def _check_member(path: str, info: tarfile.TarInfo) -> None:
    """Refuse members that would leave the artifact's folder if joined to it: odd paths, links, devices, folders."""
    problem = _path_problem(info.name)
    if problem:
        raise ArtifactError(f"{path}: member {info.name!r} leaves its folder (its path {problem}); refused")
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        kind = _KINDS.get(info.type, f"of tar type {info.type!r}")
        raise ArtifactError(
            f"{path}: member {info.name!r} leaves its folder (it is {kind}, not a regular file); refused"
        )


def _read_range(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read(size)


def _check_digest(path: str, text: bytes, expected: bytes) -> None:
    """Refuse a manifest whose bytes differ from the sha256 recorded beside it (an edit that forgot to rehash)."""
    if expected.strip().decode("ascii", "replace") != _sha256(text):
        raise ArtifactError(f"{path}: {MANIFEST} was tampered with (its sha256 differs from {MANIFEST_DIGEST})")


def _deeper_than(text: str, limit: int) -> bool:
    """Whether JSON `text` nests arrays and objects deeper than `limit` (brackets inside strings don't count), found
    without recursion, and without numpy: a submitting client reads manifests too. It stops at the first bracket
    past the limit, and is no slower than numpy's running sum (docs/benchmarks.md, "A submitting client's
    commands")."""
    brackets = _JSON_STRING.sub('""', text).encode("utf-8").translate(_BRACKET_STEPS, _NOT_BRACKETS)
    depths = map(operator.sub, itertools.accumulate(brackets), itertools.count(1))
    return any(map(limit.__lt__, depths))


def _bounded_number(kind: type) -> Any:
    def parse(literal: str) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            raise ValueError(f"a number of {len(literal)} characters (at most {MAX_NUMBER_CHARS})")
        return kind(literal)

    return parse


def _decode(path: str, data: bytes) -> Any:
    """json.loads within the bounds: no deeper than MAX_MANIFEST_DEPTH, no number longer than MAX_NUMBER_CHARS.
    Infinity and NaN are read as floats: a kernel's attributes hold them (an unbounded Clip's max is Infinity), and
    every field the runtime reads as a size or offset is checked as an integer (farm.runtime.manifest)."""
    try:
        text = data.decode("utf-8")
        if _deeper_than(text, MAX_MANIFEST_DEPTH):
            raise ValueError(f"nested deeper than {MAX_MANIFEST_DEPTH} levels")
        return json.loads(text, parse_int=_bounded_number(int), parse_float=_bounded_number(float))
    except (UnicodeDecodeError, ValueError) as error:
        raise ArtifactError(f"{path}: {MANIFEST} is not valid JSON: {error}") from None


def _parse_manifest(path: str, data: bytes) -> dict[str, Any]:
    """Decode manifest.json and check the fields every reader relies on: format_version and the member hashes."""
    manifest = _decode(path, data)
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: {MANIFEST} is not a JSON object")
    version = manifest.get("format_version")
    if version != format_version_of(manifest):
        raise ArtifactError(
            f"{path}: format_version {version!r} is not supported (this farm reads {FORMAT_VERSION}, "
            f"and {SIZED_FORMAT_VERSION} for an artifact of several sizes)"
        )
    listed = manifest.get("members")
    if not isinstance(listed, dict) or not all(
        isinstance(digest, str) and len(digest) == 64 for digest in listed.values()
    ):
        raise ArtifactError(f"{path}: {MANIFEST} has no valid 'members' table of sha256 digests")
    return manifest


def _signature_record(key_hex: str, signature_hex: str) -> bytes:
    return (json.dumps({"key": key_hex, "signature": signature_hex}, sort_keys=True) + "\n").encode()


def sign_artifact(path: str | os.PathLike[str], private_key_pem: bytes) -> str:
    """Sign the artifact at `path` in place with an Ed25519 private key (PEM, as `openssl genpkey -algorithm
    ed25519` writes it) and return the signer's public key in hex. The signature covers manifest.json, which holds
    every payload member's sha256, so it covers the whole artifact; an existing signature is replaced."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError) as error:
        raise ArtifactError(f"the signing key is not an unencrypted PEM private key: {error}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ArtifactError("the signing key is not an Ed25519 key")
    artifact = verify(path)
    payload = {
        name: LazyMember(artifact.member_size(name), functools.partial(artifact.read_member, name))
        for name in artifact.manifest["members"]
    }
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    record = _signature_record(public, key.sign(artifact.manifest_text).hex())
    reserved = {
        MANIFEST: artifact.manifest_text,
        MANIFEST_DIGEST: f"{_sha256(artifact.manifest_text)}\n".encode(),
        SIGNATURE: record,
    }
    stream_atomically(artifact.path, lambda file: _write_tar(file, payload, reserved=reserved), fsync=True)
    return public


def public_key_hex(public_key: bytes) -> str:
    """The raw Ed25519 public key, in hex, of a PEM public key file's bytes or of 64 hex digits."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    text = public_key.strip()
    if len(text) == 64 and all(chr(c) in "0123456789abcdefABCDEF" for c in text):
        return text.decode().lower()
    try:
        key = serialization.load_pem_public_key(text)
    except (ValueError, TypeError) as error:
        raise ArtifactError(f"a trusted key is neither a PEM public key nor 64 hex digits: {error}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ArtifactError("a trusted key is not an Ed25519 public key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def signer(artifact: Artifact) -> str | None:
    """The public key (hex) that signed the artifact's manifest, once its signature is checked against it; None for
    an unsigned artifact. ArtifactError ("signature invalid") when manifest.sig is malformed or doesn't match the
    manifest: a signature is reported (`farm inspect`) or trusted (`check_signed`) only once it verifies."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if artifact.signature is None:
        return None
    try:
        text = artifact.signature.decode("utf-8")
        if _deeper_than(text, 1):
            raise ValueError("nested")
        record = json.loads(text)
        key, signature = bytes.fromhex(str(record["key"])), bytes.fromhex(str(record["signature"]))
    except (ValueError, TypeError, KeyError) as error:
        raise ArtifactError(f"{artifact.path}: signature invalid: {SIGNATURE} is malformed: {error}") from None
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, artifact.manifest_text)
    except (InvalidSignature, ValueError):
        raise ArtifactError(f"{artifact.path}: signature invalid: it does not match the manifest (tampered)") from None
    return key.hex()


def check_signed(artifact: Artifact, trusted: Collection[str]) -> str:
    """The signer's public key (hex) when the artifact's manifest is signed by one of the `trusted` keys (hex);
    else ArtifactError: unsigned, a signature that doesn't verify (`signer`), or signed by a key not trusted."""
    key_hex = signer(artifact)
    if key_hex is None:
        raise ArtifactError(f"{artifact.path}: the artifact is not signed, and this runtime trusts only signed ones")
    if key_hex not in trusted:
        raise ArtifactError(f"{artifact.path}: signed by key {key_hex[:16]}..., which is not trusted")
    return key_hex
