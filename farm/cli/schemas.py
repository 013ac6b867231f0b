"""The one JSON object each command prints with `--json`: its keys, the same for a local build and a farm's, and the
version that says which keys a consumer may rely on (README.md, "JSON output").

Every object has `command` (the command's name) and `schema` (its version: bumped when a key changes meaning or
goes away; keys may be added without a bump). A key with nothing to say is null, never missing, so that a script
reads `obj["cached"]` whatever path the build took. A failed command prints the same keys of its own schema it
can fill, plus `error` and `exit_status`, with `state` "failed".
"""

from __future__ import annotations

import json
from typing import Any

BUILD_KEYS = (
    "job_id",
    "state",
    "artifact",
    "model",
    "targets",
    "sizes",
    "kernels",
    "blobs",
    "compiled",
    "cached",
    "seconds",
    "tuning",
)
"""A build (`submit`): kernels and blobs count the build's compile units (a kernel per target and device, a packed
weight per target); of them, `compiled` were compiled by this build and `cached` taken from the compile cache."""

JOB_KEYS = (
    "job_id",
    "state",
    "model",
    "targets",
    "sizes",
    "done",
    "total",
    "kernels",
    "blobs",
    "compiled",
    "cached",
    "seconds",
    "artifact_key",
    "error",
    "failed_unit",
    "exit_status",
    "tuning",
    "no_live_worker",
)
"""A farm job (`status`, `wait`): `done` of `total` compile tasks (those the cache didn't hold)."""

SCHEMAS: dict[str, tuple[int, tuple[str, ...]]] = {
    "submit": (1, BUILD_KEYS),
    "status": (1, JOB_KEYS),
    "wait": (1, JOB_KEYS),
    "download": (1, ("job_id", "artifact")),
    "cancel": (1, ("job_id", "state")),
    "run": (1, ("artifact", "device", "target", "emulated", "outputs", "output_file")),
    "bench": (1, ("artifact", "target", "latency", "repeat", "latency_spread", "steps", "kernels", "comparison")),
    "jobs": (1, ("jobs",)),
    "workers": (1, ("workers",)),
}
"""command -> (schema version, its keys besides `command` and `schema`); inspect and store keep their own
modules' (farm.cli.inspect.INSPECT_SCHEMA, farm.cli.store)."""

FAILURE_KEYS = ("state", "error", "exit_status")


def document(command: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` as `command`'s object: every key of its schema (null where `fields` lacks one). A key the schema
    doesn't name is a bug in farm, not the user's: ValueError."""
    version, keys = SCHEMAS[command]
    unknown = sorted(set(fields) - set(keys) - set(FAILURE_KEYS))
    if unknown:
        raise ValueError(f"farm {command} --json: keys {unknown} are not in its schema {version}")
    return {
        "command": command,
        "schema": version,
        **{key: fields.get(key) for key in keys},
        **{key: fields[key] for key in FAILURE_KEYS if key in fields and key not in keys},
    }


def dumps(command: str, fields: dict[str, Any]) -> str:
    """document() as one line of JSON, keys sorted."""
    return json.dumps(document(command, fields), sort_keys=True)
