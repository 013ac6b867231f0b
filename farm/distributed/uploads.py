"""What a submitting machine keeps of its uploads, so that downloading a job's artifact fetches only what it lacks.

A farm artifact's plain weights are the submitter's own bytes (a member `weights/<sha256>.bin` is the blob the
client uploaded under that sha256: farm.frontend.split), so `farm download` on the machine that submitted the job
reads them from the model's files instead of from the farm, and the packed weights made from them (the farm keeps
none: farm.distributed.recipes.Derivation) are made from those files. `FarmClient.submit` records, per job, where each blob
it named lies (`<cache>/uploads/<job id>.json`); `FarmClient.download` reads those members locally, each checked
against its sha256 (a file changed since the submit is read from the farm instead), and the rest from the store.
Records older than a job's time to live are deleted at the next submit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from farm import defaults
from farm.atomic import write_atomically
from farm.frontend.split import BlobSource, SplitModel
from farm.store import content_key, is_key


@dataclass
class Upload:
    """How far a submit's upload is: the model's blobs and their bytes, those the store lacked, the bytes sent."""

    blobs: int
    bytes: int
    missing_blobs: int
    missing_bytes: int
    sent_bytes: int = 0
    done: bool = False
    stalled: bool = False
    """A streamed upload waits for the workers to take in what it sent (none live, or all busy)."""


def uploads_dir() -> Path:
    return defaults.cache_dir() / "uploads"


def remember(job_id: str, split: SplitModel, sent_bytes: int) -> None:
    """Record where the job's blobs lie on this machine, and drop records older than JOB_TTL_SECONDS."""
    folder = uploads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    _forget_expired(folder)
    record = {
        "blobs": {key: [source.path, source.offset, source.length] for key, source in split.blobs.items()},
        "sent_bytes": sent_bytes,
    }
    write_atomically(folder / f"{job_id}.json", json.dumps(record, sort_keys=True).encode())


def recall(job_id: str) -> dict[str, BlobSource]:
    """The blobs this machine submitted for the job, by key; none when it didn't submit it (or the record is
    unreadable: the download then takes every member from the farm)."""
    try:
        record = json.loads((uploads_dir() / f"{job_id}.json").read_bytes())
        return {
            key: BlobSource(str(path), int(offset), int(length))
            for key, (path, offset, length) in record["blobs"].items()
            if is_key(key)
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def local_first(local: dict[str, BlobSource], fetch: Callable[[str], bytes]) -> Callable[[str], bytes]:
    """A member reader for recipes.write_artifact_from: a blob this machine holds is read from its file when its
    bytes still hash to the key (and the packed weights made from it, then, are made from those), anything else is
    fetched."""

    def read(key: str) -> bytes:
        source = local.get(key)
        if source is not None:
            try:
                data = source.read()
            except OSError:
                return fetch(key)
            if content_key(data) == key:
                return data
        return fetch(key)

    return read


def _forget_expired(folder: Path) -> None:
    oldest = time.time() - defaults.JOB_TTL_SECONDS
    for entry in os.scandir(folder):
        try:
            if entry.name.endswith(".json") and entry.stat().st_mtime < oldest:
                os.unlink(entry.path)
        except OSError:
            continue


def over_the_cap(model: str, weight_bytes: int, cap: int, what: str = "its weights are") -> str | None:
    """Why a job whose weights are `weight_bytes` can't be built under the store's cap, or None when it can. A job
    pins its weights from its upload to its download, so weights over the cap would hold the store over it for the
    whole job: such a job is refused before anything is uploaded (by the client) or kept (by the intake), and
    once planned, when its weights and their packed copies (`what`) are (before anything is compiled)."""
    if weight_bytes <= cap:
        return None
    return (
        f"{model}: {what} {_size(weight_bytes)}, over the farm's store cap of {_size(cap)} "
        "(FARM_STORE_MAX_BYTES of its workers); ask its operator for a larger cap or a file blob store "
        "(FARM_BLOB_STORE), or build it locally (no --broker)"
    )


def _size(count: int) -> str:
    return f"{count / 2**30:.2f} GiB ({count} bytes)" if count >= 2**30 else f"{count / 2**20:.1f} MiB ({count} bytes)"
