"""The farm's Redis users: what workers, submitters and Flower may do, as Redis ACL rules (Redis 7), built from the
key names of farm.distributed.redis_keys and the store, so that the rules and the keys can't drift apart.

Submitters (CI jobs, laptops) are authenticated but not trusted. With the submitter's credentials one can read what
clients show (job records and their progress, the jobs index, workers' advertisements and leases, store entries
to download) and write only what a submission needs: the job's request and the flags a client raises on it (cancel,
downloaded), the jobs index, the intake lists (submitted ids, admissions, damaged entries to drop:
farm.distributed.intake), the store's staging area for models. Never a job record, a store entry, a ref, a pin, a
Celery queue or control message, a script, a key listing (SCAN, KEYS) or a server setting. Whatever a submitter
writes, a worker reads as untrusted: a request's fields are validated and bound to its job id, staged bytes are
checked against their sha256.

Workers, and the operator with their credentials (`farm store`), may do anything but administer the server.
Flower reads Celery's events, queue lengths and worker replies, and sends Celery's control commands (its buttons
are the operator's, behind its own password).

`farm acl` writes the file (redis.conf's `aclfile`) from passwords in the environment, never from argv.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from farm.backends.registry import BACKENDS
from farm.distributed import redis_keys, task_messages
from farm.errors import BadInputError

STORE_PREFIX = "farm:store:"
"""The prefix of the farm's store in Redis (farm.store.redis_store.RedisStore's default)."""


@dataclass(frozen=True)
class Role:
    """One Redis user of the farm: its name, the variable its password comes from, and its rules."""

    user: str
    password_variable: str
    rules: str


SUBMITTER_CONNECTION = "+ping +auth +hello +client|setname +multi +exec +discard +subscribe +unsubscribe +publish"
"""What a submitter's connection may do on no key: log in, name itself, batch its writes, follow its job's events
and wake a job's waiters. No SELECT: a submitter stays in the farm's database (0), where every key it writes is
one the workers read, expire and bound (another database would be Redis memory no one sweeps)."""
SUBMITTER_READS = "+get +mget +exists +hgetall +scard +zrevrangebyscore"
"""The read commands clients use (a job's record, progress and request, the jobs index, workers, leases, store
entries to download)."""


HEX_KEY_GLOB = "[0-9a-f]" * 64
"""The Redis glob of a store key (a sha256 in hex)."""


def _submitter_writes(team: str) -> dict[str, tuple[str, ...]]:
    """Each key a submitter writes, with the only commands it may run on it. Redis grants a command on a key
    whatever the key holds, so a pattern with a broad command set lets a submitter turn an intake list into a
    string and end every worker's intake: one selector per kind of key, each with the commands that keep its
    type (a list is only pushed, the jobs index only added to and trimmed, a request only a hash). Requests,
    flags and the jobs index are the team's own (`team`: "" for the default submitters)."""
    ids = redis_keys.team_job_ids(team)
    return {
        " ".join(f"~{key}" for key in (redis_keys.SUBMITTED_KEY, redis_keys.ADMIT_KEY, redis_keys.REPAIR_KEY)): (
            "lpush",
        ),
        f"~{redis_keys.request_key(ids)}": ("hset", "expire"),
        f"~{redis_keys.jobs_key(team)}": ("zadd", "zremrangebyscore", "expire"),
        " ".join(
            [
                f"~{redis_keys.cancel_key(ids)} ~{redis_keys.downloaded_key(ids)}",
                *(f"~{pattern}" for pattern in _staging(team)),
            ]
        ): ("set",),
    }


def _staging(team: str) -> list[str]:
    """The staging area's keys a team writes (farm.store.RedisStore.staged_key): `[<team>.]<sha256>` and its
    chunks, where the workers count them against the team's quota."""
    upload = f"{team}.{HEX_KEY_GLOB}" if team else HEX_KEY_GLOB
    return [f"{STORE_PREFIX}staged:{upload}", f"{STORE_PREFIX}staged:{upload}:*"]


def _submitter_rules(team: str = "") -> str:
    """Read what clients show of the team's jobs, write only a submission's keys, each with the commands that keep
    its type (Redis 7 ACL selectors, one per kind of key); the commands the client's calls use, no others. A
    team's user reads, follows and cancels only its team's jobs, as the default submitters' user only theirs."""
    ids = redis_keys.team_job_ids(team)
    reads = [
        redis_keys.job_key(f"{ids}*"),
        redis_keys.request_key(f"{ids}*"),
        redis_keys.jobs_key(team),
        redis_keys.WORKERS_KEY,
        redis_keys.lease_key("*"),
        f"{STORE_PREFIX}obj:*",
        f"{STORE_PREFIX}max_bytes",
        f"{STORE_PREFIX}blob_store",
        *_staging(team),
    ]
    selectors = [f"(%R~{' %R~'.join(reads)} {SUBMITTER_READS})"]
    selectors += [
        f"({keys} {' '.join('+' + command for command in commands)})"
        for keys, commands in _submitter_writes(team).items()
    ]
    return f"resetkeys resetchannels -@all {SUBMITTER_CONNECTION} &{redis_keys.job_events_channel(ids)} " + " ".join(
        selectors
    )


TEAM_USER_PREFIX = "farm-submitter-"


def team_role(team: str) -> Role:
    """The Redis user of one team's submitters (`farm-submitter-<team>`, its password in
    FARM_SUBMITTER_PASSWORD_<TEAM>): a submitter whose jobs carry the team (redis_keys.team_of), which is what its
    quota counts and what keeps teams from seeing or cancelling each other's jobs."""
    redis_keys.check_team(team)
    return Role(
        f"{TEAM_USER_PREFIX}{team}", f"FARM_SUBMITTER_PASSWORD_{team.upper().replace('-', '_')}", _submitter_rules(team)
    )


def team_of_url(url: str) -> str:
    """The team a client's Redis URL submits for: the team of a `farm-submitter-<team>` user, else "" (the default
    submitters, and workers or the operator submitting)."""
    user = unquote(urlsplit(url).username or "")
    return user[len(TEAM_USER_PREFIX) :] if user.startswith(TEAM_USER_PREFIX) else ""


_CELERY_KEYS = "~_kombu.binding* ~*.reply.celery.pidbox* ~celeryev.* ~unacked* " + " ".join(
    f"%R~{queue}*"
    for queue in (
        "celery",
        task_messages.CONTROL_QUEUE,
        *(prefix for backend in BACKENDS.values() for prefix in backend.queue_prefixes),
    )
)
"""What Flower reads and writes in Celery's keys: exchange bindings, its replies to control commands, its event
queue, and (read only) the farm's queues, whose lengths its Broker page shows (kombu names a queue's priority
levels `<queue>\x06\x16<n>`, hence the trailing *)."""

ROLES: dict[str, Role] = {
    "worker": Role("farm-worker", "FARM_WORKER_PASSWORD", "resetkeys resetchannels ~* &* +@all -@admin -@dangerous"),
    "submitter": Role("farm-submitter", "FARM_SUBMITTER_PASSWORD", _submitter_rules()),
    "flower": Role(
        "farm-flower",
        "FARM_FLOWER_REDIS_PASSWORD",
        f"resetkeys resetchannels {_CELERY_KEYS} &* -@all +@connection +@pubsub +@read +@list +@set +@sortedset +@hash "
        "+@transaction +@scripting +set +del +expire +time -@dangerous",
    ),
}
"""The farm's Redis users, by role."""


def user_line(role: Role, password: str) -> str:
    """The ACL file line of one user; the password is stored as its SHA-256, as Redis allows."""
    if not password:
        raise BadInputError(f"{role.password_variable} is empty: every farm user needs a password")
    return f"user {role.user} on #{hashlib.sha256(password.encode()).hexdigest()} {role.rules}"


def role_named(name: str) -> Role:
    """A role by name: one of ROLES, or `team:<team>` (team_role)."""
    kind, _, team = name.partition(":")
    return team_role(team) if kind == "team" else ROLES[name]


def acl_file(passwords: dict[str, str], default_user: str = "off") -> str:
    """The ACL file for the given passwords (by role name, role_named): `default_user` rules the unnamed user (off:
    every client must name its user, so no connection gets more than its role)."""
    lines = [f"user default {default_user}"]
    lines += [user_line(role_named(name), password) for name, password in passwords.items()]
    return "\n".join(lines) + "\n"


def teams_from_environment(environ: Mapping[str, str]) -> list[str]:
    """The teams FARM_TEAMS names (comma-separated; none when unset), each checked."""
    return [redis_keys.check_team(team.strip()) for team in environ.get("FARM_TEAMS", "").split(",") if team.strip()]


def passwords_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each role's password from its variable, and each FARM_TEAMS team's; BadInputError naming the missing ones."""
    environ = os.environ if environ is None else environ
    names = [*ROLES, *(f"team:{team}" for team in teams_from_environment(environ))]
    missing = [
        role_named(name).password_variable for name in names if not environ.get(role_named(name).password_variable)
    ]
    if missing:
        raise BadInputError(f"set {', '.join(missing)} (the farm's Redis passwords; see deploy/README.md)")
    return {name: environ[role_named(name).password_variable] for name in names}
