"""The farm's Redis key names, in one place: the job board's, the intake's, the leases' and the clients' keys and
channels, the patterns the ACL (farm.distributed.acl) and the expiry sweep (farm.store.expiry) are built from, what
lives under the keys of fixed name, and the ids (jobs, teams, uploads) key names are made of. Nothing else knows how
a key is named.

Submitters write some of these keys and are not trusted: every decode of what they push validates it and raises
BadInputError naming what is wrong. Clients import this module too, on installs without numpy or llvmlite
(pip install farm).
"""

from __future__ import annotations

import json
import re
from typing import Any

from farm.errors import BadInputError
from farm.store.base import is_key

WORKERS_KEY = "farm:workers"
"""A hash: worker name -> its advertised capabilities (`encode_capabilities`)."""
TEAM = re.compile(r"[a-z][a-z0-9-]{0,14}")
"""A team of submitters (its own Redis user, farm.distributed.acl): a letter, then up to 14 letters, digits or
dashes. At most 15 characters, so that `<team>.` always holds its dot within a job id's first 16 characters and
no team's id matches the pattern of the default submitters' ids (16 hex digits)."""
JOB_ID = re.compile(r"(?:[a-z][a-z0-9-]{0,14}\.)?[0-9a-f]{16}")
"""A job id: 16 hex digits (the start of its request's sha256), after `<team>.` when a team's user submitted it."""
HEX_ID_GLOB = "[0-9a-f]" * 16
"""The Redis glob of 16 hex digits: the default submitters' job ids, in the ACL's key patterns."""


def check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise BadInputError(f"not a job id ([<team>.]<16 lowercase hex digits>): {str(job_id)[:80]!r}")
    return job_id


def check_team(team: object) -> str:
    if not isinstance(team, str) or not TEAM.fullmatch(team):
        raise BadInputError(f"not a team name (a letter, then at most 14 letters, digits or '-'): {str(team)[:80]!r}")
    return team


def team_of(job_id: str) -> str:
    """The team whose user submitted the job ("" for the default submitters' user): what its key names say, which
    Redis's ACL lets only that user write."""
    return job_id.rpartition(".")[0]


def team_job_ids(team: str) -> str:
    """The Redis glob of the team's job ids (the default submitters' when `team` is "")."""
    return f"{team}.{HEX_ID_GLOB}" if team else HEX_ID_GLOB


def job_key(job_id: str) -> str:
    """The job's record, a Redis hash."""
    return f"farm:job:{job_id}"


def phase_key(job_id: str, phase: str) -> str:
    """The set of units finished in one phase of the job ("compile", "link", "tune")."""
    return f"{job_key(job_id)}:{phase}"


def linking_claim_key(job_id: str) -> str:
    """Set by the step that starts the job's linking, so that no other starts it again."""
    return f"{job_key(job_id)}:linking-started"


def retune_grant_key(job_id: str) -> str:
    """Set by a client with the workers' (the operator's) credentials for a job submitted with --retune: a retune
    replaces tuning records every job uses, so a request asking for one without this grant is refused (submitters
    may read this key, not write it: farm.distributed.acl)."""
    return f"{job_key(job_id)}:retune-granted"


def deliveries_key(job_id: str, unit: str) -> str:
    """How many times one unit's task has started."""
    return f"{job_key(job_id)}:deliveries:{unit}"


RUNNING_KEY = "farm:running"
"""A hash: Celery task id -> the task running now and who runs it (`RunningTask`): what a dead worker's peers
dispatch again."""


def lease_key(worker: str) -> str:
    """A worker's liveness lease: a string holding its incarnation, which expires unless the worker renews it."""
    return f"farm:lease:{worker}"


def store_pin_owner(job_id: str) -> str:
    """The owner of a job's pins in the store (what the job needs, then its artifact until downloaded)."""
    return f"job:{check_job_id(job_id)}"


def job_of_pin_owner(owner: str) -> str | None:
    """The job id a store pin owner names, or None when the owner isn't a job (the tuning database, say)."""
    prefix, _, job_id = owner.partition(":")
    return job_id if prefix == "job" and JOB_ID.fullmatch(job_id) else None


def job_events_channel(job_id: str) -> str:
    """The pub/sub channel on which the board signals each state change and finished unit of the job; waiting
    clients block on it instead of polling the record."""
    return f"{job_key(job_id)}:events"


JOBS_KEY = "farm:jobs"
"""A sorted set: job id -> its creation time (Unix seconds), the index behind `farm jobs` (the default submitters';
each team has its own, jobs_key). Entries older than the job records' time to live are dropped whenever a job is
added. Submitters write it, so every id read from it is checked and one with no request or record is skipped."""


def jobs_key(team: str) -> str:
    """The jobs index of a team's submitters (JOBS_KEY for the default submitters)."""
    return f"{JOBS_KEY}:{team}" if team else JOBS_KEY


def live_jobs_key(team: str) -> str:
    """A set, written by workers only: the team's jobs accepted and not known to have ended, which its quota
    (defaults.max_live_jobs) counts."""
    return f"farm:live:{team}" if team else "farm:live"


# Keys a submitter writes (farm.distributed.acl gives it these, the jobs index and the store's staging area and
# nothing else to write): its job's request and the flags it raises on its job. Workers read them as untrusted input.


def request_key(job_id: str) -> str:
    """The job as its submitter asked for it (a hash of REQUEST_FIELDS), which the worker that accepts the job
    turns into its record (job_key); until then clients show the request as a queued job."""
    return f"farm:request:{job_id}"


def cancel_key(job_id: str) -> str:
    """Raised by `farm cancel`: the job counts as cancelled from then on (farm.distributed.board)."""
    return f"{request_key(job_id)}:cancel"


SUBMITTED_KEY = "farm:submitted"
"""A list of job ids whose request is new: a submitter pushes its job's id, a worker's intake
(farm.distributed.intake) pops it and accepts the job. Submitters never write a Celery queue: a message there could
name any task, queue or routing it liked, an id here names nothing but a request."""
ADMIT_KEY = "farm:admit"
"""A list of `<upload token>:<blob key>`: a submitter streaming its weights into a farm with a file blob store
pushes each blob it staged, and a worker's intake admits it at once (reads it from staging, checks its sha256,
writes its file), so that Redis holds at most the client's window of staged bytes, not the whole model."""
UPLOAD_TOKEN = re.compile(r"(?:[a-z][a-z0-9-]{0,14}\.)?[0-9a-f]{32}")
"""A streamed upload's token: 32 hex digits, after `<team>.` for a team's upload (whose staging it names)."""


REPAIR_KEY = "farm:repair"
"""A list of store keys whose bytes a download found damaged (they don't hash to the key): a worker's intake reads
the entry, which drops it when it is damaged (farm.store.Store.get), so that the artifacts naming it are built again,
not reused (a reuse checks members' lengths, not their bytes: farm.store.Store.incomplete). Any submitter may push
any key: each is read at most once per REPAIR_SECONDS (repair_claim_key)."""
REPAIR_SECONDS = 600


def repair_claim_key(key: str) -> str:
    """Set (by a worker) while the entry `key` counts as checked."""
    return f"{REPAIR_KEY}:{key}"


def decode_repair(raw: object) -> str:
    """The store key of a submitter's repair entry; BadInputError when it is not one."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    if not is_key(text):
        raise BadInputError(f"not a store key (64 hex digits): {text[:120]!r}")
    return text


def encode_admission(token: str, key: str) -> str:
    return f"{token}:{key}"


def decode_admission(raw: object) -> tuple[str, str]:
    """(upload token, blob key) from a submitter's admission entry; BadInputError when it is not one."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    token, _, key = text.partition(":")
    if not UPLOAD_TOKEN.fullmatch(token) or not is_key(key):
        raise BadInputError(f"not an admission entry ([<team>.]<32 hex digits>:<64 hex digits>): {text[:120]!r}")
    return token, key


def upload_pin_owner(token: str) -> str:
    """The owner of the pins that keep an upload's admitted blobs until its job is accepted (and pins them)."""
    return f"upload:{token}"


def downloaded_key(job_id: str) -> str:
    """Raised by `farm download`: the job's artifact may leave the store once its pins are swept."""
    return f"{request_key(job_id)}:downloaded"


EXPIRY_SWEEP_KEY = "farm:expiry-sweep"
"""Claimed by the worker whose housekeeping gives a time to live to the submitter-written keys that lack one
(farm.store.expiry), at most once per EXPIRY_SWEEP_SECONDS across the farm."""
EXPIRY_SWEEP_SECONDS = 300
STAGING_SWEEP_KEY = "farm:staging-sweep"
"""Claimed by the worker whose housekeeping keeps each team's staged bytes under its quota (farm.store.Store
.trim_staging), at most once per STAGING_SWEEP_SECONDS across the farm."""
STAGING_SWEEP_SECONDS = 30


def staging_trimmed_key(team: str) -> str:
    """Set by a worker (for a day) when it dropped some of the team's staged uploads for its quota: what a job
    whose upload is then missing is told."""
    return f"farm:staging-trimmed:{team}" if team else "farm:staging-trimmed"


SUBMITTER_KEYS_TTL = {
    request_key("*"): "request, cancel and downloaded flags",
    JOBS_KEY: "the jobs index",
    jobs_key("*"): "the teams' jobs indexes",
}
"""The patterns of keys a submitter writes in the farm's Redis (its staged bytes are the store's), each of which
lives JOB_TTL_SECONDS at most: what the expiry sweep looks for."""


FIXED_KEY_TYPES = {
    SUBMITTED_KEY: "list",
    ADMIT_KEY: "list",
    REPAIR_KEY: "list",
    JOBS_KEY: "zset",
    WORKERS_KEY: "hash",
    RUNNING_KEY: "hash",
}
"""The farm's keys of fixed name and the Redis type each holds. While one holds another type, every call on it
fails (WRONGTYPE: every intake's pop, every `farm submit`), so workers delete such a key
(farm.distributed.board.JobBoard.drop_mistyped): nothing of value is lost, since the farm never put it there."""


def encode_capabilities(capabilities: dict[str, Any]) -> str:
    """A worker's advertisement: host, pid, CPU and OpenCL devices, as JSON."""
    return json.dumps(capabilities, sort_keys=True)


def decode_capabilities(text: str | None) -> dict[str, Any]:
    """An advertisement read back; {} when it is missing or not a JSON object (a worker that wrote garbage
    advertises nothing)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
