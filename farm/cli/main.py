"""The `farm` command line: `farm submit` builds an artifact, `farm run` runs one.

Exit statuses (README.md, "Exit statuses"): 0 done, 1 build failed, 2 bad input (usage errors too), 3 cancelled or
unknown job, 4 farm unreachable, 5 a regression found by `bench --fail-on-regression`, 6 `wait --timeout` ran out
while the job goes on, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, a cancelled CI job) while uploading,
waiting on or downloading a farm job. Errors go to stderr as one line that names what is wrong; `--json` prints each
command's object of farm.cli.schemas, failures too.

This module makes the `farm` group and registers the commands, which live beside it by what they act on:
farm/cli/submit.py (`submit`), jobs.py (a farm's jobs and workers), local.py (an artifact on this machine: `run`,
`bench`, `inspect`, `sign`), operate.py (`worker`, `acl`) and store.py (`farm store`); shared.py holds what they
share.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from farm import __version__
from farm.cli import blas_threads  # noqa: F401  (before anything loads numpy)
from farm.cli.jobs import cancel, download, jobs, list_workers_command, status, wait
from farm.cli.local import bench, inspect, run, sign
from farm.cli.operate import acl_command, worker
from farm.cli.shared import broker_option, json_option, reports_errors
from farm.cli.store import store_group
from farm.cli.submit import submit
from farm.errors import ExitStatus


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


for command in (
    submit,
    inspect,
    status,
    wait,
    download,
    cancel,
    worker,
    acl_command,
    list_workers_command,
    jobs,
    run,
    sign,
    bench,
):
    main.add_command(command)
main.add_command(store_group(reports_errors, broker_option, json_option))
