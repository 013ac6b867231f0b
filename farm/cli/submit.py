"""`farm submit`: a model built into an artifact, on this machine or, with a farm, uploaded, waited on and
downloaded (the farm's other commands on the job it makes are in farm/cli/jobs.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from farm.backends.registry import BACKENDS
from farm.cli import schemas
from farm.cli.jobs import build_fields, wait_with_progress
from farm.cli.shared import (
    artifact_output_option,
    broker_option,
    deliver,
    farm_client,
    json_option,
    reports_errors,
    shown,
)
from farm.cli.stopping import exits_saying, stoppable, stops_saying
from farm.errors import BadInputError

if TYPE_CHECKING:
    from farm.backends.registry import Devices


@click.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="T",
    help=f"{'; '.join(backend.usage for backend in BACKENDS.values())}; repeatable (default: cpu, this host).",
)
@artifact_output_option
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
    from farm.frontend.wire import check_model_file
    from farm.ir.shapes import parse_sizes

    if not model.is_file():
        raise BadInputError(f"{model}: no such model file")
    check_model_file(model)
    sizes = parse_sizes(shape_specs) if shape_specs else []
    if not broker:
        _refuse_farm_options({"--no-wait": no_wait, "--detach": detach})
    client = farm_client(broker) if broker else None
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

    # onnx's import (0.6 s with ml_dtypes 0.7) is not planning: loaded before the progress starts, it never shows a
    # "planning" line before a refusal's one line.
    from farm.frontend import onnx_import  # noqa: F401

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
        artifact = deliver(output, build_into)
    result = dataclasses.replace(results[0], artifact=artifact)
    for note in result.tuning.notes if result.tuning else []:
        click.echo(f"farm: note: {shown(note)}", err=True)
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
        click.echo(shown(result.artifact))


def _refuse_farm_options(given: dict[str, bool]) -> None:
    """Options that mean something only on a farm are refused without one, not silently ignored."""
    used = [option for option, value in given.items() if value]
    if used:
        raise BadInputError(
            f"{' and '.join(used)} need{'s' if len(used) == 1 else ''} a farm (--broker URL or "
            f"FARM_BROKER_URL); a local build runs in this process until its artifact is written"
        )


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
        f"farm: note: {shown(unrunnable(artifact, targets, host))}; add --target cpu to run it here too"
        f"{shown(emulated)}",
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
        click.echo(schemas.dumps("submit", build_fields(client.status(job_id))) if as_json else job_id)
        return
    with stoppable(client, job_id, cancel=not detach):
        status = wait_with_progress(client, job_id, model.name, prefetch=True)
    if status.get("tuning_note"):
        click.echo(f"farm: note: {shown(status['tuning_note'])}", err=True)
    try:
        with stops_saying(f"while downloading; job {job_id} is done: farm download {job_id} fetches it"):
            artifact = deliver(output, lambda folder: client.download(job_id, folder))
    except UnreachableError as error:
        raise UnreachableError(f"{error}; job {job_id} is done: 'farm download {job_id}' fetches it") from None
    if as_json:
        click.echo(schemas.dumps("submit", {**build_fields(status), "artifact": artifact}))
    else:
        click.echo(shown(artifact))
