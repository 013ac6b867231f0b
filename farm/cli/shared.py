"""What the `farm` commands share (farm/cli/main.py registers them from the modules beside this one): errors as
their documented exit status and one line (`reports_errors`, with the --json object of a failure), untrusted text
escaped for the terminal (`shown`), the --broker and --json options, the farm's URL and client, and an artifact
written to where -o says (`deliver`). Like every command module, it imports nothing heavy at its top.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import click

from farm.cli import schemas
from farm.errors import BadInputError, ExitStatus, FarmError, missing_package


def _fail(error: str, status: ExitStatus, as_json: bool) -> None:
    click.echo(f"farm: error: {shown(error)}", err=True)
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


def shown(text: object) -> str:
    """`text` as the terminal gets it: its control characters (escape sequences, line breaks) as Python escapes
    (farm.cli.progress.escaped, imported only when something is printed: rich is slow to import). Every string the
    CLI prints that a model, an artifact, the farm's Redis or a worker chose goes through it, so none can recolour
    the terminal or forge a line of its own; --json output is escaped by JSON itself."""
    from farm.cli.progress import escaped

    return escaped(str(text))


def shown_lines(text: str) -> str:
    """A report of several lines (farm bench's), each line `shown`."""
    return "\n".join(shown(line) for line in text.split("\n"))


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


broker_option = click.option(
    "--broker", envvar="FARM_BROKER_URL", metavar="URL", help="Redis URL of the farm (default: $FARM_BROKER_URL)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
artifact_output_option = click.option(
    "-o",
    "--output",
    "--output-dir",
    "output",
    default="artifacts",
    show_default=True,
    type=click.Path(),
    help="A folder (the artifact is FOLDER/<model>.farm) or a file ending in .farm.",
)
"""Where `submit` and `download` write an artifact."""


def broker_url(broker: str | None) -> str:
    """The farm's URL, checked before anything connects (farm.defaults.redis_url); the error names where it came
    from, --broker or FARM_BROKER_URL."""
    from farm.defaults import redis_url

    if not broker:
        raise BadInputError("no farm configured: pass --broker URL or set FARM_BROKER_URL")
    from_env = click.get_current_context().get_parameter_source("broker") is click.core.ParameterSource.ENVIRONMENT
    return redis_url(broker, "FARM_BROKER_URL" if from_env else "--broker")


def farm_client(broker: str | None):
    from farm.distributed.client import FarmClient

    return FarmClient(broker_url(broker))


def deliver(output: str, write_into: Callable[[str], str]) -> str:
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
