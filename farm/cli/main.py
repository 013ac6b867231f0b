"""The `farm` command line: `farm submit` builds an artifact, `farm run` runs one.

Exit statuses (README.md, "Exit statuses"): 0 done, 1 build failed, 2 bad input (usage errors too), 3 cancelled or
unknown job, 4 farm unreachable, 5 a regression found by `bench --fail-on-regression`, 6 `wait --timeout` ran out
while the job goes on, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, a cancelled CI job) while uploading,
waiting on or downloading a farm job. Errors go to stderr as one line that names what is wrong; `--json` prints each
command's object of farm.cli.schemas, failures too.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from farm import __version__
from farm.backends.registry import BACKENDS
from farm.cli import schemas
from farm.cli.stopping import exits_saying, stoppable, stops_saying
from farm.cli.store import store_group
from farm.errors import BadInputError, ExitStatus, FarmError, missing_package

if TYPE_CHECKING:
    from farm.backends.registry import Devices


def _fail(error: str, status: ExitStatus, as_json: bool) -> None:
    click.echo(f"farm: error: {_shown(error)}", err=True)
    if as_json:
        click.echo(_failure_json(error, status))
    sys.exit(int(status))


def _failure_json(error: str, status: ExitStatus) -> str:
    """The failed command's --json object (farm.cli.schemas): its schema's keys, state "failed", the error."""
    context = click.get_current_context(silent=True)
    command = context.info_name if context else "farm"
    fields = {"state": "failed", "error": error, "exit_status": int(status)}
    if command in schemas.SCHEMAS:
        return schemas.dumps(command, fields)
    return json.dumps({"command": command, **fields}, sort_keys=True)


def _shown(text: object) -> str:
    """`text` as the terminal gets it: its control characters (escape sequences, line breaks) as Python escapes
    (farm.cli.progress.escaped, imported only when something is printed: rich is slow to import). Every string the
    CLI prints that a model, an artifact, the farm's Redis or a worker chose goes through it, so none can recolour
    the terminal or forge a line of its own; --json output is escaped by JSON itself."""
    from farm.cli.progress import escaped

    return escaped(str(text))


def _shown_lines(text: str) -> str:
    """A report of several lines (farm bench's), each line `_shown`."""
    return "\n".join(_shown(line) for line in text.split("\n"))


def reports_errors(command: Callable) -> Callable:
    """Turn farm's errors into their documented exit status and a one-line message."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return command(*args, **kwargs)
        except FarmError as error:
            _fail(str(error), error.exit_status, as_json)
        except ModuleNotFoundError as error:
            missing = missing_package(error)
            if missing is None:
                raise
            _fail(str(missing), missing.exit_status, as_json)
        except OSError as error:
            _fail(f"{error.filename or ''}: {error.strerror or error}".lstrip(": "), ExitStatus.BAD_INPUT, as_json)
        except KeyboardInterrupt:
            click.echo("farm: interrupted", err=True)
            sys.exit(int(ExitStatus.INTERRUPTED))

    return wrapper


class FarmGroup(click.Group):
    """The `farm` group, whose usage errors (an unknown command or option, a missing argument, a value out of range)
    end as every other error does: one line, `farm: error: ...` and the command's --help to read, exit 2 (click
    prints three lines of usage). `farm` alone still prints its help."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as error:
            error.show()
            sys.exit(error.exit_code)
        except click.UsageError as error:
            command = error.ctx.command_path if error.ctx else "farm"
            click.echo(f"farm: error: {error.format_message().rstrip('.')} (see '{command} --help')", err=True)
            sys.exit(int(ExitStatus.BAD_INPUT))
        except click.ClickException as error:
            click.echo(f"farm: error: {error.format_message()}", err=True)
            sys.exit(error.exit_code)
        except click.exceptions.Abort:
            click.echo("farm: interrupted", err=True)
            sys.exit(int(ExitStatus.INTERRUPTED))


@click.group(cls=FarmGroup)
@click.version_option(__version__, prog_name="farm")
def main() -> None:
    """farm: compile ONNX models into one runnable artifact, on this machine or on a build farm."""


broker_option = click.option(
    "--broker", envvar="FARM_BROKER_URL", metavar="URL", help="Redis URL of the farm (default: $FARM_BROKER_URL)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def _broker(broker: str | None) -> str:
    """The farm's URL, checked before anything connects (farm.defaults.redis_url); the error names where it came
    from, --broker or FARM_BROKER_URL."""
    from farm.defaults import redis_url

    if not broker:
        raise BadInputError("no farm configured: pass --broker URL or set FARM_BROKER_URL")
    from_env = click.get_current_context().get_parameter_source("broker") is click.core.ParameterSource.ENVIRONMENT
    return redis_url(broker, "FARM_BROKER_URL" if from_env else "--broker")


def _client(broker: str | None):
    from farm.distributed.client import FarmClient

    return FarmClient(_broker(broker))


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="T",
    help="cpu (this host, the default), cpu:TRIPLE, cpu:TRIPLE:CPU[:FEATURES], opencl (every OpenCL "
    "device) or opencl:FINGERPRINT; repeatable.",
)
@click.option(
    "-o",
    "--output",
    "--output-dir",
    "output",
    default="artifacts",
    show_default=True,
    type=click.Path(),
    help="A folder (the artifact is FOLDER/<model>.farm) or a file ending in .farm.",
)
@json_option
@click.option("--workers", type=click.IntRange(min=1), help="Local compile processes (default: every core).")
@broker_option
@click.option("--no-wait", is_flag=True, help="With a farm: return the job id at once.")
@click.option(
    "--detach",
    is_flag=True,
    help="With a farm: Ctrl-C or SIGTERM stops waiting but leaves the job running (default: they cancel it).",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Build every kernel and blob again instead of taking them from the compile cache (this "
    "machine's store, or the farm's); what is built is cached again.",
)
@click.option(
    "--tune",
    is_flag=True,
    help="First time the GEMM variants of each kernel the tuning database lacks, on a CPU of its target "
    "(this host, or a farm worker of that CPU class), and record the fastest.",
)
@click.option(
    "--retune",
    is_flag=True,
    help="Like --tune, but time every tunable kernel again (on a farm: the operator's credentials).",
)
@click.option(
    "--shape",
    "shape_specs",
    multiple=True,
    metavar="NAME=SIZE",
    help="Pin a dynamic dimension by its symbolic name (batch=1) or a whole input (input_ids=1x128); "
    "repeatable. Several sizes (batch=1,8,32) build one artifact with a schedule per size, which "
    "runs the one that matches its inputs.",
)
@reports_errors
def submit(
    model: Path,
    targets: tuple[str, ...],
    output: str,
    as_json: bool,
    workers: int | None,
    broker: str | None,
    no_wait: bool,
    detach: bool,
    no_cache: bool,
    tune: bool,
    retune: bool,
    shape_specs: tuple[str, ...],
) -> None:
    """Build MODEL.onnx into OUTPUT/<stem>.farm (or the file OUTPUT.farm) and print the artifact's path; on the farm
    when one is set (--broker or FARM_BROKER_URL), else on this machine.

    Kernels use the variants the tuning database holds for their target (the default where it holds none). A model
    with dynamic dimensions needs --shape for each (exported batch or sequence sizes). On the
    farm the job id goes to stderr first thing; Ctrl-C while waiting cancels the job (with --detach: leaves it
    running) and exits 130, SIGTERM (a cancelled CI job) likewise with 143."""
    from farm.backends.registry import parse_targets
    from farm.ir.shapes import parse_sizes

    if not model.is_file():
        raise BadInputError(f"{model}: no such model file")
    sizes = parse_sizes(shape_specs) if shape_specs else []
    if not broker:
        _refuse_farm_options({"--no-wait": no_wait, "--detach": detach})
    client = _client(broker) if broker else None
    chosen = parse_targets(targets, _devices(client.broker if client else None))
    if client:
        _submit_to_farm(
            client,
            model,
            chosen,
            output,
            as_json,
            no_wait,
            detach,
            no_cache,
            {"tune": tune, "retune": retune, "sizes": sizes},
        )
        return
    from farm.build.executor import LocalExecutor
    from farm.build.local import build_model
    from farm.cli.progress import build_progress

    results = []

    def build_into(folder: str) -> str:
        results.append(
            build_model(
                model,
                folder,
                chosen,
                executor=executor,
                progress=progress.update,
                tune=tune,
                retune=retune,
                tune_progress=progress.tuning,
                sizes=sizes,
                phase=progress.phase,
                no_cache=no_cache,
            )
        )
        return results[0].artifact

    with LocalExecutor(workers) as executor, build_progress(model.name) as progress:
        artifact = _deliver(output, build_into)
    result = dataclasses.replace(results[0], artifact=artifact)
    for note in result.tuning.notes if result.tuning else []:
        click.echo(f"farm: note: {_shown(note)}", err=True)
    _note_unrunnable(result.artifact)
    if as_json:
        from farm.ir.shapes import sizes_to_json

        tuning = result.tuning.to_json() if result.tuning else None
        click.echo(
            schemas.dumps(
                "submit",
                {
                    **result.to_json(),
                    "model": model.stem,
                    "sizes": sizes_to_json(sizes),
                    "tuning": {"timed": len(tuning["timed"]), "notes": tuning["notes"]} if tuning else None,
                },
            )
        )
    else:
        click.echo(_shown(result.artifact))


def _refuse_farm_options(given: dict[str, bool]) -> None:
    """Options that mean something only on a farm are refused without one, not silently ignored."""
    used = [option for option, value in given.items() if value]
    if used:
        raise BadInputError(
            f"{' and '.join(used)} need{'s' if len(used) == 1 else ''} a farm (--broker URL or "
            f"FARM_BROKER_URL); a local build runs in this process until its artifact is written"
        )


def _deliver(output: str, write_into: Callable[[str], str]) -> str:
    """The artifact's path: `write_into(folder)` writes `<folder>/<model>.farm` and returns its path; an `output`
    ending in .farm (and not a folder) names the file itself, written through a fresh folder beside it and moved
    into place by one rename, so that no other file there (a `<model>.farm` of the same stem) is touched."""
    if not output.endswith(".farm") or os.path.isdir(output):
        return write_into(output)
    target = os.path.abspath(output)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".farm-", dir=os.path.dirname(target))
    try:
        os.replace(write_into(staging), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _note_unrunnable(artifact: str) -> None:
    """Say so when this host can't run what was just built (a cross-compiled target alone replaced
    artifacts/<model>.farm, and every `farm run` here then failed without a word of why), by the check `farm run`
    makes: each CPU target's `requires` against this host's features (farm.runtime.host)."""
    from farm.artifact import read_manifest
    from farm.runtime.host import arch_of, runs_on, this_host, unrunnable
    from farm.runtime.manifest import check_sizes

    host = this_host()
    sizes = [size for _, size in check_sizes(artifact, read_manifest(artifact))]
    targets = [target for size in sizes for target in size.targets]
    if any(size.opencl for size in sizes) or any(runs_on(target, host) for target in targets):
        return
    foreign = [target for size in sizes for target in size.cpu_targets if arch_of(target.triple) != host.arch]
    emulated = f" (farm run --target {foreign[0].id} runs it under qemu)" if foreign else ""
    click.echo(
        f"farm: note: {_shown(unrunnable(artifact, targets, host))}; add --target cpu to run it here too"
        f"{_shown(emulated)}",
        err=True,
    )


def _devices(broker: str | None) -> Devices:
    """What `--target KIND` means (`opencl`: every OpenCL device): the devices of the farm's live workers, or of this
    host without a farm."""
    from farm.backends.registry import BACKENDS, Devices

    if broker:
        from farm.distributed.fleet import farm_device_ids

        return Devices("on the farm's workers", lambda kind: farm_device_ids(broker, kind))
    return Devices("on this host", lambda kind: BACKENDS[kind].host_devices())


def _submit_to_farm(
    client,
    model: Path,
    targets: list,
    output: str,
    as_json: bool,
    no_wait: bool,
    detach: bool,
    no_cache: bool,
    options: dict[str, Any],
) -> None:
    from farm.cli.progress import UploadLines
    from farm.errors import UnreachableError

    with exits_saying(f"while uploading {model.name}; nothing was submitted (its staged bytes expire)"):
        job_id = client.submit(model, targets, no_cache=no_cache, on_upload=UploadLines(model.name), **options)
    click.echo(f"farm: job {job_id} submitted; farm status {job_id} / farm cancel {job_id}", err=True)
    if no_wait:
        click.echo(schemas.dumps("submit", _build_fields(client.status(job_id))) if as_json else job_id)
        return
    with stoppable(client, job_id, cancel=not detach):
        status = _wait_with_progress(client, job_id, model.name, prefetch=True)
    if status.get("tuning_note"):
        click.echo(f"farm: note: {_shown(status['tuning_note'])}", err=True)
    try:
        with stops_saying(f"while downloading; job {job_id} is done: farm download {job_id} fetches it"):
            artifact = _deliver(output, lambda folder: client.download(job_id, folder))
    except UnreachableError as error:
        raise UnreachableError(f"{error}; job {job_id} is done: 'farm download {job_id}' fetches it") from None
    if as_json:
        click.echo(schemas.dumps("submit", {**_build_fields(status), "artifact": artifact}))
    else:
        click.echo(_shown(artifact))


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


def _build_fields(status: dict[str, Any]) -> dict[str, Any]:
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
        click.echo(f"farm: no live worker consumes {noun} {_shown(', '.join(names))}; {_shown(hint)}", err=True)


def _say_lost(worker: str, tasks: int) -> None:
    """`farm: worker W lost; re-running N tasks` on stderr, once per worker the job lost: the count the progress
    shows stalls for as long as the worker's lease takes to lapse, and the line says why. A worker names itself
    (--hostname), so its name is printed escaped."""
    click.echo(f"farm: worker {_shown(worker)} lost; re-running {tasks} task{'' if tasks == 1 else 's'}", err=True)


def _wait_with_progress(
    client, job_id: str, label: str, timeout: float | None = None, prefetch: bool = False
) -> dict[str, Any]:
    from farm.cli.progress import build_progress
    from farm.distributed.client import raise_for_state

    with build_progress(f"{label} on the farm", quiet_start=0) as progress:
        status = client.wait(job_id, timeout, progress.status, _say_unserved, _say_lost, prefetch=prefetch)
    raise_for_state(status)
    return status


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@json_option
@reports_errors
def inspect(artifact: Path, as_json: bool) -> None:
    """Show what ARTIFACT holds: the model's inputs and outputs (names, dtypes, shapes), its targets, kernel and
    weight counts and sizes, the farm and toolchain that built it, and the key that signed it. Every member's sha256
    is checked first, and a signature against the key it names: one that doesn't verify is refused ('signature
    invalid', exit 2, as `farm run --trust` refuses it)."""
    from farm.cli.inspect import describe, format_description

    if not artifact.is_file():
        raise BadInputError(f"{artifact}: no such artifact file")
    description = describe(artifact)
    click.echo(json.dumps(description, sort_keys=True) if as_json else format_description(description))


@main.command()
@click.argument("job_id")
@broker_option
@json_option
@reports_errors
def status(job_id: str, broker: str | None, as_json: bool) -> None:
    """Show a farm job: state, tasks done of total, and the failing unit and its error. For a live job, stderr
    names each of its queues that no live worker consumes (--json: the list `no_live_worker` too)."""
    client = _client(broker)
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
        line += f"; failed at {_shown(info['failed_unit'])}"
    return line + (f": {_shown(info['error'])}" if info.get("error") else "")


@main.command()
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

    client = _client(broker)
    with stoppable(client, job_id, cancel=False):
        status = _wait_with_progress(client, job_id, job_id, timeout)
    if JobState(status["state"]) not in TERMINAL:
        raise StillRunningError(
            f"job {job_id} still {status['state']} after {timeout:g} s; it goes on: "
            f"farm wait {job_id} / farm cancel {job_id}"
        )
    if as_json:
        click.echo(schemas.dumps("wait", _job_fields(status)))
    else:
        click.echo(f"{job_id}: {status['state']}")


@main.command()
@click.argument("job_id")
@click.option(
    "-o",
    "--output",
    "--output-dir",
    "output",
    default="artifacts",
    show_default=True,
    type=click.Path(),
    help="A folder (the artifact is FOLDER/<model>.farm) or a file ending in .farm.",
)
@broker_option
@json_option
@reports_errors
def download(job_id: str, output: str, broker: str | None, as_json: bool) -> None:
    """Download a finished job's artifact into OUTPUT/<model>.farm (or the file OUTPUT.farm) and print its path."""
    client = _client(broker)
    with stops_saying("while downloading; nothing was written"):
        artifact = _deliver(output, lambda folder: client.download(job_id, folder))
    click.echo(schemas.dumps("download", {"job_id": job_id, "artifact": artifact}) if as_json else _shown(artifact))


@main.command()
@click.argument("job_id")
@broker_option
@json_option
@reports_errors
def cancel(job_id: str, broker: str | None, as_json: bool) -> None:
    """Cancel a farm job: its remaining tasks are skipped and no artifact is made."""
    from farm.errors import JobError

    if not _client(broker).cancel(job_id):
        raise JobError(f"job {job_id} had already ended; nothing to cancel")
    click.echo(schemas.dumps("cancel", {"job_id": job_id, "state": "cancelled"}) if as_json else f"{job_id}: cancelled")


@main.command()
@broker_option
@click.option("--concurrency", type=click.IntRange(min=1), help="Compile processes (default: every core).")
@click.option("--hostname", help="Worker name (default: farm-<pid>@<host>).")
@click.option("--loglevel", default="INFO", show_default=True)
@reports_errors
def worker(broker: str | None, concurrency: int | None, hostname: str | None, loglevel: str) -> None:
    """Run a farm worker on this host, consuming the queues its CPU and OpenCL devices can serve."""
    from farm.distributed.worker import run_worker

    run_worker(_broker(broker), concurrency, hostname, loglevel)


@main.command("acl")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The ACL file to write (redis.conf's aclfile).",
)
@reports_errors
def acl_command(output: str) -> None:
    """Write the farm's Redis users (farm-worker, farm-submitter, farm-flower, and farm-submitter-<team> for each
    team FARM_TEAMS names, comma-separated) as a Redis ACL file. Their passwords come from FARM_WORKER_PASSWORD,
    FARM_SUBMITTER_PASSWORD, FARM_FLOWER_REDIS_PASSWORD and FARM_SUBMITTER_PASSWORD_<TEAM> (upper case, '-' as
    '_'), never from the command line; the file holds their SHA-256 only."""
    from farm.atomic import write_atomically
    from farm.distributed.acl import acl_file, passwords_from_environment

    write_atomically(output, acl_file(passwords_from_environment()).encode(), fsync=True)


@main.command("workers")
@broker_option
@json_option
@reports_errors
def list_workers_command(broker: str | None, as_json: bool) -> None:
    """List live workers with their host, capabilities and queues."""
    from farm.distributed.fleet import list_workers

    found = list_workers(_client(broker).broker)
    if not found:
        click.echo("farm: no live worker on this farm; start one with 'farm worker'", err=True)
    if as_json:
        click.echo(schemas.dumps("workers", {"workers": found}))
        return
    for item in found:
        cpu = item.get("cpu", {})
        devices = ", ".join(d["device"] for d in item.get("opencl", [])) or "no OpenCL"
        click.echo(
            _shown(
                f"{item['name']}: {cpu.get('triple', '?')} {cpu.get('cpu', '?')}; {devices}; "
                f"toolchain {item.get('toolchain', {}).get('key', '?')}; queues {', '.join(item['queues'])}"
            )
        )


@main.command()
@broker_option
@json_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Jobs to list.")
@reports_errors
def jobs(broker: str | None, as_json: bool, limit: int) -> None:
    """List the farm's recent jobs, newest first: id, state, model and age (jobs are kept 7 days). A model's name is
    its submitter's choice: control characters in it print as escapes (\\x1b, \\n), so each job is one line."""
    found = _client(broker).jobs(limit)
    if not found:
        from farm.defaults import JOB_TTL_SECONDS

        click.echo(f"farm: no jobs on this farm in the last {JOB_TTL_SECONDS // 86400} days", err=True)
    if as_json:
        click.echo(schemas.dumps("jobs", {"jobs": found}))
        return
    for job in found:
        click.echo(
            f"{_shown(job['job_id'])}  {_shown(job['state']):<10} {_shown(job.get('model', '?')):<24} "
            + (_age(job["age_s"]) if "age_s" in job else _shown(job.get("error", "")))
        )


def _age(seconds: float) -> str:
    """An age as people read it: 42s, 7m, 3h, 2d ago."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="One model input; repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the outputs to this .npz file.")
@click.option("--print", "show", is_flag=True, help="Print each output's shape and first values.")
@click.option(
    "--device",
    type=click.Choice(list(BACKENDS)),
    default="cpu",
    show_default=True,
    help="Run the CPU library, or the OpenCL kernels on this host's OpenCL device.",
)
@click.option(
    "--target",
    metavar="T",
    help="The artifact's CPU target to run, as farm submit named it (cpu:TRIPLE[:CPU[:FEATURES]]) or by its "
    "id (farm inspect); one of another architecture runs under qemu (default: the best this host runs).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="CPU threads one run may use (0: every CPU this process may run on; an emulated run uses one).",
)
@click.option(
    "--trust",
    "trust",
    multiple=True,
    metavar="PUBKEY",
    help="Run only if signed by this Ed25519 public key (PEM file or hex); repeatable; adds to FARM_TRUSTED_KEYS.",
)
@json_option
@reports_errors
def run(
    artifact: str,
    inputs: tuple[str, ...],
    output: str | None,
    show: bool,
    device: str,
    target: str | None,
    threads: int,
    trust: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run ARTIFACT on the given inputs with farm's runtime; print each output's shape and first values, or write
    them all to the .npz file OUTPUT (exactly that name). A --target of another architecture than this host's runs
    under qemu user-mode emulation (Debian: apt-get install qemu-user-static and the target's libc6-<arch>-cross)."""
    from farm import runtime
    from farm.cli.arrays import parse_inputs, save_outputs, summary
    from farm.runtime.host import this_host
    from farm.runtime.selection import needs_emulation

    model = runtime.load(artifact, device=device, threads=threads, trust=trust, target=target)
    outputs = model.run(parse_inputs(inputs))
    if output:
        save_outputs(output, outputs)
    if as_json:
        described = {name: {"shape": list(array.shape), "dtype": str(array.dtype)} for name, array in outputs.items()}
        click.echo(
            schemas.dumps(
                "run",
                {
                    "artifact": os.path.abspath(artifact),
                    "device": device,
                    "target": model.target.get("id"),
                    "emulated": device == "cpu" and needs_emulation(str(model.target.get("triple", "")), this_host()),
                    "outputs": described,
                    "output_file": os.path.abspath(output) if output else None,
                },
            )
        )
    elif show or not output:
        for name, array in outputs.items():
            click.echo(_shown(summary(name, array)))


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option(
    "--key",
    "key",
    required=True,
    type=click.Path(dir_okay=False),
    help="Ed25519 private key, PEM (openssl genpkey -algorithm ed25519).",
)
@reports_errors
def sign(artifact: str, key: str) -> None:
    """Sign ARTIFACT in place (its manifest, which holds every member's sha256); print the public key in hex."""
    from farm.artifact import sign_artifact

    with open(key, "rb") as file:
        click.echo(sign_artifact(artifact, file.read()))


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option(
    "--compare",
    "baseline",
    type=click.Path(dir_okay=False),
    metavar="OTHER.farm",
    help="Compare with this artifact (the baseline), timed in alternating rounds, node by node; flags nodes "
    "more than 5% slower beyond their noise (a one-sided Mann-Whitney U test of the repeats).",
)
@click.option("--repeat", type=click.IntRange(min=1), default=20, show_default=True, help="Timed runs.")
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Threads of the whole-model runs (0: every CPU); kernels are timed on one thread.",
)
@click.option("--fail-on-regression", is_flag=True, help="Exit with status 5 when --compare flags a node (for CI).")
@click.option(
    "--device",
    type=click.Choice(list(BACKENDS)),
    default="cpu",
    show_default=True,
    help="Time the artifact's CPU part, or its OpenCL part on this host's OpenCL device.",
)
@click.option(
    "--target",
    metavar="T",
    help="The CPU target to time, as farm run takes it; only one this host runs "
    "natively (an emulated run's time says nothing of the target's).",
)
@json_option
@reports_errors
def bench(
    artifact: str,
    baseline: str | None,
    repeat: int,
    threads: int,
    fail_on_regression: bool,
    device: str,
    target: str | None,
    as_json: bool,
) -> None:
    """Time ARTIFACT on this host: whole-model latency, and each kernel's time and GFLOP/s."""
    from farm.cli.bench import (
        bench_artifact,
        bench_pair,
        compare,
        comparison_fields,
        format_comparison,
        format_report,
        repeats_needed,
    )

    if baseline is None:
        report = bench_artifact(artifact, repeat, threads=threads, device=device, target=target)
        click.echo(schemas.dumps("bench", report.to_json()) if as_json else _shown_lines(format_report(report)))
        return
    before, report = bench_pair([baseline, artifact], repeat, threads=threads, device=device, target=target)
    needed = repeats_needed(len(report.steps))
    if fail_on_regression and repeat < needed:
        raise BadInputError(
            f"--repeat {repeat} is too few to show a slowdown beyond noise over "
            f"{len(report.steps)} nodes: --fail-on-regression needs --repeat {needed} or more"
        )
    changes = compare(before, report)
    click.echo(
        schemas.dumps("bench", comparison_fields(before, report, changes))
        if as_json
        else _shown_lines(format_report(report) + "\n\n" + format_comparison(before, report, changes))
    )
    if fail_on_regression and any(change.flagged for change in changes):
        sys.exit(int(ExitStatus.REGRESSION))


main.add_command(store_group(reports_errors, broker_option, json_option))
