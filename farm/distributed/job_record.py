"""The farm's job record, in one place: job states, the record (one Redis hash per job) with each field's encoding,
and the request a submitter writes, from which a worker makes the record.

A request is a submitter's word (submitters are not trusted), so every decode validates what it reads and raises
BadInputError naming the field: a bad record or request never reaches IR, paths or shell text. Clients import this
module too, on installs without numpy or llvmlite (pip install farm).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any

from farm.backends.registry import Target, check_target_count, target_from_json
from farm.defaults import MAX_TARGETS
from farm.distributed.redis_keys import check_team
from farm.errors import BadInputError
from farm.ir.shapes import PinnedShapes, sizes_from_json, sizes_to_json
from farm.store.base import is_key


class JobState(str, Enum):
    QUEUED = "queued"
    PLANNING = "planning"
    TUNING = "tuning"
    COMPILING = "compiling"
    LINKING = "linking"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class Codec:
    encode: Callable[[Any], str]
    decode: Callable[[str], Any]


def _json_list(text: str) -> list:
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError("not a list")
    return value


def _string_list(text: str) -> list[str]:
    value = _json_list(text)
    if not all(isinstance(item, str) for item in value):
        raise ValueError("not a list of strings")
    return value


def _key(text: str) -> str:
    if not is_key(text):
        raise ValueError(f"{text[:80]!r} is not a store key")
    return text


def check_model_name(name: str) -> str:
    """A model's name (its file's stem) names files on workers and in artifacts: no folders, no dot names."""
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= 200
        or "/" in name
        or "\\" in name
        or "\0" in name
        or name in (".", "..")
    ):
        raise BadInputError(f"model name {str(name)[:80]!r} can't name a file (no '/', at most 200 characters)")
    return name


STR = Codec(str, str)
KEY = Codec(_key, _key)
NAME = Codec(check_model_name, check_model_name)
BOOL = Codec(lambda value: str(bool(value)), lambda text: text == "True")
INT = Codec(lambda value: str(int(value)), int)
FLOAT = Codec(lambda value: repr(float(value)), float)
STATE = Codec(lambda state: JobState(state).value, JobState)


def _targets(text: str) -> list[Target]:
    """Targets read back: at most MAX_TARGETS (a request naming more is refused before they are all parsed)."""
    return check_target_count([target_from_json(data) for data in _json_list(text)[: MAX_TARGETS + 1]])


TARGETS = Codec(lambda targets: json.dumps([t.to_json() for t in targets]), _targets)
STRINGS = Codec(json.dumps, _string_list)
SIZES = Codec(
    lambda sizes: json.dumps(sizes_to_json(sizes)),
    lambda text: sizes_from_json(value) if (value := _json_list(text)) else [],
)

MAP_FIELDS = {"tune_errors": "tune_error:", "libraries": "library:", "lost_workers": "lost_worker:"}
"""Record fields that are maps, kept as one hash field per entry (`<prefix><key>`), so that concurrent steps
add entries without overwriting each other."""
MAX_HOLDER_CHARS = 512
"""The longest holder (`<worker name>#<incarnation>`) a record names: a host name (253) with room to spare."""


def _lost_worker(holder: str, text: str) -> tuple[str, int]:
    """A `lost_workers` entry: the holder whose lease lapsed (RunningTask.holder) and how many of the job's tasks it
    held, all dispatched again. Clients print the name (escaped), so its form and length are checked, and the count
    is a positive number."""
    worker, _, incarnation = holder.rpartition("#")
    if not worker or not incarnation or len(holder) > MAX_HOLDER_CHARS:
        raise ValueError(f"{holder[:80]!r} is not a worker's name#incarnation")
    tasks = int(text)
    if tasks < 1:
        raise ValueError(f"{tasks} tasks")
    return holder, tasks


MAP_ENTRIES: dict[str, Callable[[str, str], tuple[str, Any]]] = {"lost_workers": _lost_worker}
"""How a map field's entries are checked when a record is read (key, text -> key, value); the others' entries stay
strings (a tuning error's text; a library's store key, which the store checks when it reads it)."""


@dataclass(frozen=True)
class JobRecord:
    """A farm job as the board keeps it (one Redis hash per job); see `encode_fields` for the wire form."""

    state: JobState
    model_key: str
    model_name: str
    model_sha256: str
    targets: list[Target]
    no_cache: bool = False
    tune: bool = False
    retune: bool = False
    sizes: list[PinnedShapes] = field(default_factory=list)
    """The sizes of dynamic input dimensions the submitter pinned, one artifact holding them all (`--shape`,
    farm.ir.shapes.parse_sizes); none for a static model."""
    submitted_from: str = ""
    created: float = 0.0
    updated: float = 0.0
    finished: float | None = None
    total: int | None = None
    kernels: int = 0
    blobs: int = 0
    targets_total: int = 0
    link_plan_key: str | None = None
    artifact_key: str | None = None
    cached: bool = False
    error: str = ""
    exit_status: int | None = None
    failed_unit: str = ""
    tuning_note: str = ""
    tune_units: list[str] | None = None
    tuned: bool = False
    tune_errors: dict[str, str] = field(default_factory=dict)
    libraries: dict[str, str] = field(default_factory=dict)
    lost_workers: dict[str, int] = field(default_factory=dict)
    """Workers lost while they ran the job's tasks (their holder, `<name>#<incarnation>`) -> how many of its tasks
    each held, which a peer's reaper dispatched again (farm.distributed.leases)."""

    @property
    def is_over(self) -> bool:
        return self.state in TERMINAL

    def tuning_asked(self, flag: str) -> bool:
        """Whether the job asked for `flag` ("tune" or "retune") and its tuning phase hasn't run yet."""
        return bool(getattr(self, flag)) and not self.tuned

    @classmethod
    def decode(cls, hash_fields: dict[str, str]) -> JobRecord:
        """A record from its Redis hash; BadInputError names the first field that doesn't parse."""
        values: dict[str, Any] = {name: {} for name in MAP_FIELDS}
        for name, text in hash_fields.items():
            mapped = next((m for m, prefix in MAP_FIELDS.items() if name.startswith(prefix)), None)
            if mapped:
                key, value = _map_entry(mapped, name[len(MAP_FIELDS[mapped]) :], text)
                values[mapped][key] = value
            elif name in CODECS:
                try:
                    values[name] = CODECS[name].decode(text)
                except (ValueError, TypeError, KeyError) as error:
                    raise BadInputError(f"job record field {name!r} is malformed ({error})") from None
        missing = [
            f.name
            for f in fields(cls)
            if f.name not in values and f.default is MISSING and f.default_factory is MISSING
        ]
        if missing:
            raise BadInputError(f"job record lacks {', '.join(missing)}")
        return cls(**values)


def _map_entry(name: str, key: str, text: str) -> tuple[str, Any]:
    """One entry of the map field `name`, checked by its MAP_ENTRIES function if it has one."""
    try:
        return MAP_ENTRIES.get(name, lambda key, text: (key, text))(key, text)
    except ValueError as error:
        raise BadInputError(f"job record field {name!r} is malformed ({error})") from None


CODECS: dict[str, Codec] = {
    "state": STATE,
    "model_key": KEY,
    "model_name": NAME,
    "model_sha256": KEY,
    "targets": TARGETS,
    "no_cache": BOOL,
    "tune": BOOL,
    "retune": BOOL,
    "submitted_from": STR,
    "created": FLOAT,
    "updated": FLOAT,
    "finished": FLOAT,
    "total": INT,
    "kernels": INT,
    "blobs": INT,
    "targets_total": INT,
    "link_plan_key": KEY,
    "artifact_key": KEY,
    "cached": BOOL,
    "error": STR,
    "exit_status": INT,
    "failed_unit": STR,
    "tuning_note": STR,
    "tune_units": STRINGS,
    "tuned": BOOL,
    "sizes": SIZES,
}


REQUEST_FIELDS = (
    "model_key",
    "model_name",
    "model_sha256",
    "targets",
    "no_cache",
    "tune",
    "retune",
    "sizes",
    "submitted_from",
    "created",
)
"""The record fields a submitter chooses; every other field (state, keys, counts, errors) is the farm's."""
NONCE = re.compile(r"[0-9a-f]{32}")


def encode_request(record: JobRecord, team: str = "") -> tuple[str, dict[str, str]]:
    """A new job's id and request (request_key): the submitter's fields of `record` and a random nonce. The id is
    the start of the request's sha256 (after `<team>.` for a team's user), so a request rewritten by another
    submitter no longer matches its job."""
    request = {
        **encode_fields(**{name: getattr(record, name) for name in REQUEST_FIELDS}),
        "nonce": secrets.token_hex(16),
    }
    digest = request_job_id(request)
    return (f"{check_team(team)}.{digest}" if team else digest), request


def request_job_id(request: dict[str, str]) -> str:
    """The job id a request stands for: the first 16 hex digits of the sha256 of its fields."""
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]


def decode_request(hash_fields: dict[str, str], job_id: str) -> JobRecord:
    """The queued record a request asks for. A request is a submitter's word: a field it may not set, a field
    missing or one that doesn't parse is refused (BadInputError naming it), so is a request that isn't the one
    its job id was made from. `model_key` is the split graph the submitter staged (farm.frontend.split), which
    the intake checks against its bytes; `model_sha256` is the submitter's word for its model file, which never
    reaches the farm (the build identity holds both: farm.distributed.steps.artifact_ref)."""
    allowed = (*REQUEST_FIELDS, "nonce")
    extra = sorted(set(hash_fields) - set(allowed))
    missing = [name for name in allowed if name not in hash_fields]
    if extra or missing:
        raise BadInputError(
            f"job request {'has fields it may not set: ' + ', '.join(extra) if extra else ''}"
            f"{'; ' if extra and missing else ''}{'lacks ' + ', '.join(missing) if missing else ''}"
        )
    if not NONCE.fullmatch(hash_fields["nonce"]) or request_job_id(hash_fields) != job_id.rpartition(".")[2]:
        raise BadInputError(f"job request of {job_id} is not the one its id was made from (rewritten)")
    values = {}
    for name in REQUEST_FIELDS:
        try:
            values[name] = CODECS[name].decode(hash_fields[name])
        except (ValueError, TypeError, KeyError) as error:
            raise BadInputError(f"job request field {name!r} is malformed ({error})") from None
    if not math.isfinite(values["created"]) or len(values["submitted_from"]) > 255:
        raise BadInputError("job request field 'created' or 'submitted_from' is out of range")
    return JobRecord(JobState.QUEUED, updated=values["created"], **values)


def encode_fields(**values: Any) -> dict[str, str]:
    """Record fields as Redis hash fields (strings); map fields become one hash field per entry."""
    encoded = {}
    for name, value in values.items():
        if name in MAP_FIELDS:
            encoded.update({f"{MAP_FIELDS[name]}{key}": str(item) for key, item in value.items()})
        elif name in CODECS:
            encoded[name] = CODECS[name].encode(value)
        else:
            raise ValueError(f"no job record field {name!r}")
    return encoded


def encode_record(record: JobRecord) -> dict[str, str]:
    """Every set field of a record (None fields are left out)."""
    return encode_fields(
        **{f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}
    )
