"""The commands on a farm's jobs and workers (`status`, `wait`, `download`, `cancel`, `jobs`, `workers`), and
what `farm submit` shares with them: waiting on a job with its progress, the lines about queues no live worker
consumes and workers lost, and a job's status as --json fields. They are a submitting client's commands: each imports
what it needs inside it, the farm's client included, and nothing heavy (docs/architecture.md, "Packaging")."""

from __future__ import annotations

from typing import Any

import click

from farm.cli import schemas
from farm.cli.shared import (
    artifact_output_option,
    broker_option,
    deliver,
    farm_client,
    json_option,
    reports_errors,
    shown,
)
from farm.cli.stopping import stoppable, stops_saying


def _job_fields(status: dict[str, Any]) -> dict[str, Any]:
    """A farm job's status (FarmClient.status) as `status`/`wait` --json fields: compiled (compile tasks done) and
    cached (the build's units the cache held) once the job is planned."""
    fields = {
        key: value for key, value in status.items() if key not in ("tuning_note", "artifact_reused", "lost_workers")
    }
    units = status["kernels"] + status["blobs"]
    planned = units > 0 or status["artifact_reused"]
    fields.update(compiled=status["done"] if planned else None, cached=units - status["total"] if planned else None)
    if "tuning" in status:
        fields["tuning"] = {
            "timed": status["tuning"]["done"],
            "total": status["tuning"]["total"],
            "errors": status["tuning"]["errors"],
            "notes": _notes(status),
        }
    return fields


def build_fields(status: dict[str, Any]) -> dict[str, Any]:
    """A farm job's status as `submit --json` fields, the keys a local build has (farm.cli.schemas.BUILD_KEYS)."""
    fields = {key: value for key, value in _job_fields(status).items() if key in schemas.BUILD_KEYS}
    if fields.get("tuning"):
        fields["tuning"] = {key: fields["tuning"][key] for key in ("timed", "notes")}
    return fields


def _notes(status: dict[str, Any]) -> list[str]:
    return [status["tuning_note"]] if status.get("tuning_note") else []


def _say_unserved(queues: dict[str, str]) -> None:
    """One line on stderr per way to serve them: `farm: no live worker consumes queue(s) Q[, ...]; HINT`."""
    by_hint: dict[str, list[str]] = {}
    for queue, hint in queues.items():
        by_hint.setdefault(hint, []).append(queue)
    for hint, names in by_hint.items():
        noun = "queue" if len(names) == 1 else "queues"
        click.echo(f"farm: no live worker consumes {noun} {shown(', '.join(names))}; {shown(hint)}", err=True)


def _say_lost(worker: str, tasks: int) -> None:
    """`farm: worker W lost; re-running N tasks` on stderr, once per worker the job lost: the count the progress
    shows stalls for as long as the worker's lease takes to lapse, and the line says why. A worker names itself
    (--hostname), so its name is printed escaped."""
    click.echo(f"farm: worker {shown(worker)} lost; re-running {tasks} task{'' if tasks == 1 else 's'}", err=True)


def wait_with_progress(
    client, job_id: str, label: str, timeout: float | None = None, prefetch: bool = False
) -> dict[str, Any]:
    from farm.cli.progress import build_progress
    from farm.distributed.client import raise_for_state

    with build_progress(f"{label} on the farm", quiet_start=0) as progress:
        status = client.wait(job_id, timeout, progress.status, _say_unserved, _say_lost, prefetch=prefetch)
    raise_for_state(status)
    return status


@click.command()
@click.argument("job_id")
@broker_option
@json_option
@reports_errors
def status(job_id: str, broker: str | None, as_json: bool) -> None:
    """Show a farm job: state, tasks done of total, and the failing unit and its error. For a live job, stderr
    names each of its queues that no live worker consumes (--json: the list `no_live_worker` too)."""
    client = farm_client(broker)
    info = client.status(job_id)
    unserved = client.unserved_queues(job_id)
    _say_unserved(unserved)
    if as_json:
        click.echo(schemas.dumps("status", {**_job_fields(info), "no_live_worker": list(unserved) or None}))
        return
    click.echo(_status_line(info))


def _status_line(info: dict[str, Any]) -> str:
    """`JOB: state, done/total compile tasks done`, then the tuning progress, the failing unit and the error when
    there are (the farm's words about the model: escaped)."""
    line = f"{info['job_id']}: {info['state']}, {info['done']}/{info['total']} compile tasks done"
    if "tuning" in info:
        line += f", {info['tuning']['done']}/{info['tuning']['total']} kernels timed"
    if info.get("failed_unit"):
        line += f"; failed at {shown(info['failed_unit'])}"
    return line + (f": {shown(info['error'])}" if info.get("error") else "")


@click.command()
@click.argument("job_id")
@broker_option
@json_option
@click.option(
    "--timeout", type=click.FloatRange(min=0), help="Stop waiting after this many seconds (exit 6; the job goes on)."
)
@reports_errors
def wait(job_id: str, broker: str | None, as_json: bool, timeout: float | None) -> None:
    """Wait for a farm job to end; the exit status says how it ended. Ctrl-C stops waiting (exit 130), and so does
    SIGTERM (exit 143), leaving the job running."""
    from farm.distributed.job_record import TERMINAL, JobState
    from farm.errors import StillRunningError

    client = farm_client(broker)
    with stoppable(client, job_id, cancel=False):
        status = wait_with_progress(client, job_id, job_id, timeout)
    if JobState(status["state"]) not in TERMINAL:
        raise StillRunningError(
            f"job {job_id} still {status['state']} after {timeout:g} s; it goes on: "
            f"farm wait {job_id} / farm cancel {job_id}"
        )
    if as_json:
        click.echo(schemas.dumps("wait", _job_fields(status)))
    else:
        click.echo(f"{job_id}: {status['state']}")


@click.command()
@click.argument("job_id")
@artifact_output_option
@broker_option
@json_option
@reports_errors
def download(job_id: str, output: str, broker: str | None, as_json: bool) -> None:
    """Download a finished job's artifact into OUTPUT/<model>.farm (or the file OUTPUT.farm) and print its path."""
    client = farm_client(broker)
    with stops_saying("while downloading; nothing was written"):
        artifact = deliver(output, lambda folder: client.download(job_id, folder))
    click.echo(schemas.dumps("download", {"job_id": job_id, "artifact": artifact}) if as_json else shown(artifact))


@click.command()
@click.argument("job_id")
@broker_option
@json_option
@reports_errors
def cancel(job_id: str, broker: str | None, as_json: bool) -> None:
    """Cancel a farm job: its remaining tasks are skipped and no artifact is made."""
    from farm.errors import JobError

    if not farm_client(broker).cancel(job_id):
        raise JobError(f"job {job_id} had already ended; nothing to cancel")
    click.echo(schemas.dumps("cancel", {"job_id": job_id, "state": "cancelled"}) if as_json else f"{job_id}: cancelled")


@click.command("workers")
@broker_option
@json_option
@reports_errors
def list_workers_command(broker: str | None, as_json: bool) -> None:
    """List live workers with their host, capabilities and queues."""
    from farm.distributed.fleet import list_workers

    found = list_workers(farm_client(broker).broker)
    if not found:
        click.echo("farm: no live worker on this farm; start one with 'farm worker'", err=True)
    if as_json:
        click.echo(schemas.dumps("workers", {"workers": found}))
        return
    for item in found:
        cpu = item.get("cpu", {})
        devices = ", ".join(d["device"] for d in item.get("opencl", [])) or "no OpenCL"
        click.echo(
            shown(
                f"{item['name']}: {cpu.get('triple', '?')} {cpu.get('cpu', '?')}; {devices}; "
                f"toolchain {item.get('toolchain', {}).get('key', '?')}; queues {', '.join(item['queues'])}"
            )
        )


@click.command()
@broker_option
@json_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Jobs to list.")
@reports_errors
def jobs(broker: str | None, as_json: bool, limit: int) -> None:
    """List the farm's recent jobs, newest first: id, state, model and age (jobs are kept 7 days). A model's name is
    its submitter's choice: control characters in it print as escapes (\\x1b, \\n), so each job is one line."""
    found = farm_client(broker).jobs(limit)
    if not found:
        from farm.defaults import JOB_TTL_SECONDS

        click.echo(f"farm: no jobs on this farm in the last {JOB_TTL_SECONDS // 86400} days", err=True)
    if as_json:
        click.echo(schemas.dumps("jobs", {"jobs": found}))
        return
    for job in found:
        click.echo(
            f"{shown(job['job_id'])}  {shown(job['state']):<10} {shown(job.get('model', '?')):<24} "
            + (_age(job["age_s"]) if "age_s" in job else shown(job.get("error", "")))
        )


def _age(seconds: float) -> str:
    """An age as people read it: 42s, 7m, 3h, 2d ago."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"
