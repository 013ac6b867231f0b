"""The commands on a built artifact, on this machine and without a farm: `run`, `bench`, `inspect` and `sign`.
They need farm's worker extra (numpy, the runtime, cryptography), which each imports inside it, so that the
client's commands never load it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from farm.backends.registry import BACKENDS
from farm.cli import schemas
from farm.cli.shared import json_option, reports_errors, shown, shown_lines
from farm.errors import BadInputError, ExitStatus


@click.command()
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


@click.command()
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
            click.echo(shown(summary(name, array)))


@click.command()
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


@click.command()
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
        click.echo(schemas.dumps("bench", report.to_json()) if as_json else shown_lines(format_report(report)))
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
        else shown_lines(format_report(report) + "\n\n" + format_comparison(before, report, changes))
    )
    if fail_on_regression and any(change.flagged for change in changes):
        sys.exit(int(ExitStatus.REGRESSION))
