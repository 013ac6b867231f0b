"""The `farm` command line: `farm submit` builds an artifact, `farm run` runs one.

Exit statuses (README.md, "Exit statuses"): 0 done, 1 build failed, 2 bad input, 3 cancelled or unknown job,
4 farm unreachable. Errors go to stderr as one line that names what is wrong; `--json` also puts them on stdout.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from farm import __version__
from farm.errors import BadInputError, ExitStatus, FarmError


def _fail(error: str, status: ExitStatus, as_json: bool) -> None:
    click.echo(f"farm: error: {error}", err=True)
    if as_json:
        click.echo(json.dumps({"state": "failed", "error": error, "exit_status": int(status)}))
    sys.exit(int(status))


def reports_errors(command: Callable) -> Callable:
    """Turn farm's errors into their documented exit status and a one-line message."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return command(*args, **kwargs)
        except FarmError as error:
            _fail(str(error), error.exit_status, as_json)
        except OSError as error:
            _fail(f"{error.filename or ''}: {error.strerror or error}".lstrip(": "), ExitStatus.BAD_INPUT, as_json)

    return wrapper


@click.group()
@click.version_option(__version__, prog_name="farm")
def main() -> None:
    """farm: compile ONNX models into one runnable artifact, on this machine or on a build farm."""


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", "targets", multiple=True, metavar="T",
              help="cpu (this host, the default), cpu:TRIPLE or cpu:TRIPLE:CPU[:FEATURES]; repeatable.")
@click.option("-o", "--output-dir", default="artifacts", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object describing the job on stdout.")
@click.option("--workers", type=click.IntRange(min=1), help="Local compile processes (default: every core).")
@reports_errors
def submit(model: Path, targets: tuple[str, ...], output_dir: str, as_json: bool, workers: int | None) -> None:
    """Build MODEL.onnx into OUTPUT_DIR/<stem>.farm and print the artifact's path."""
    from farm.build import build_model
    from farm.codegen.targets import parse_target
    from farm.executors import LocalExecutor
    from farm.progress import BuildProgress

    if not model.is_file():
        raise BadInputError(f"{model}: no such model file")
    parsed = [parse_target(t) for t in targets]
    with LocalExecutor(workers) as executor, BuildProgress(model.name) as progress:
        result = build_model(model, output_dir, parsed, executor=executor, progress=progress.update)
    click.echo(json.dumps(result.to_json(), sort_keys=True) if as_json else result.artifact)


def _parse_inputs(pairs: tuple[str, ...]) -> dict[str, np.ndarray]:
    feeds = {}
    for pair in pairs:
        name, sep, file = pair.partition("=")
        if not sep or not name or not file:
            raise BadInputError(f"--input {pair!r}: expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise BadInputError(f"--input {name}: can't read {file!r} as a .npy array: {error}") from None
    return feeds


def _summary(name: str, array: np.ndarray) -> str:
    flat = array.reshape(-1)
    head = ", ".join(f"{v:.6g}" for v in flat[:8])
    more = ", ..." if flat.size > 8 else ""
    return f"{name}: shape {list(array.shape)} {array.dtype} argmax {int(flat.argmax())} [{head}{more}]"


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="One model input; repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the outputs to this .npz file.")
@click.option("--print", "show", is_flag=True, help="Print each output's shape and first values.")
@reports_errors
def run(artifact: str, inputs: tuple[str, ...], output: str | None, show: bool) -> None:
    """Run ARTIFACT on the given inputs with farm's runtime."""
    from farm import runtime

    model = runtime.load(artifact)
    outputs = model.run(_parse_inputs(inputs))
    if output:
        np.savez(output, **outputs)
    if show or not output:
        for name, array in outputs.items():
            click.echo(_summary(name, array))
