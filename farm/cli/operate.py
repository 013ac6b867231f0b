"""The operator's commands: `farm worker`, which serves the farm from this host, and `farm acl`, which writes
the farm's Redis users."""

from __future__ import annotations

import click

from farm.cli.shared import broker_option, broker_url, reports_errors


@click.command()
@broker_option
@click.option("--concurrency", type=click.IntRange(min=1), help="Compile processes (default: every core).")
@click.option("--hostname", help="Worker name (default: farm-<pid>@<host>).")
@click.option("--loglevel", default="INFO", show_default=True)
@reports_errors
def worker(broker: str | None, concurrency: int | None, hostname: str | None, loglevel: str) -> None:
    """Run a farm worker on this host, consuming the queues its CPU and OpenCL devices can serve."""
    from farm.distributed.worker import run_worker

    run_worker(broker_url(broker), concurrency, hostname, loglevel)


@click.command("acl")
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
