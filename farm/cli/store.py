"""`farm store stats` and `farm store gc`: what the content-addressed store holds against its cap, and eviction now.

With a farm (`--broker` or FARM_BROKER_URL) they act on the farm's store (FARM_STORE_URL, else the broker's Redis);
without one, on this machine's store (farm.store.default_store_root). The commands are made by `store_group`, which
takes the `farm` command's shared decorators, so that this module needs nothing from farm/cli/main.py (which
registers the group) and the two don't import each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from farm.store import Store
    from farm.store.base import StoreStats

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def human_bytes(count: int) -> str:
    """`count` bytes in the largest binary unit that keeps it at least 1 (B, KiB, MiB, GiB, TiB)."""
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{count} B" if unit == "B" else f"{value:.2f} {unit}"


def open_chosen_store(broker: str | None) -> Store:
    """The farm's store with a broker, else this machine's."""
    from farm import defaults
    from farm.store import FileStore, default_store_root, open_store

    return open_store(defaults.store_url(broker)) if broker else FileStore(default_store_root())


def describe(url: str, stats: StoreStats) -> str:
    """Three lines an operator reads: which store, how full against the cap, what pins hold."""
    from farm.errors import redact_url

    share = f"{stats.bytes / stats.max_bytes:.0%}" if stats.max_bytes else "?"
    owners = ", ".join(stats.pin_owners[:5]) + (
        f", ... ({len(stats.pin_owners)} in all)" if len(stats.pin_owners) > 5 else ""
    )
    return (
        f"store {redact_url(url)}\n"
        f"  {stats.entries} entries, {human_bytes(stats.bytes)} of the {human_bytes(stats.max_bytes)} cap "
        f"({share})\n"
        f"  pinned: {stats.pinned_entries} entries, {human_bytes(stats.pinned_bytes)}"
        + (f", by {owners}" if owners else "")
    )


def store_group(reports_errors: Decorator, broker_option: Decorator, json_option: Decorator) -> click.Group:
    """The `farm store` command group, decorated like every other farm command."""

    @click.group("store")
    def store() -> None:
        """The content-addressed store (models, objects, libraries, artifacts): its size and eviction."""

    @store.command()
    @broker_option
    @json_option
    @reports_errors
    def stats(broker: str | None, as_json: bool) -> None:
        """Entries and bytes against the cap (FARM_STORE_MAX_BYTES), and what pins keep from eviction."""
        from farm.errors import redact_url

        with open_chosen_store(broker) as chosen:
            found = chosen.stats()
            url = chosen.url
        click.echo(
            json.dumps({"store": redact_url(url), **found.to_json()}, sort_keys=True)
            if as_json
            else describe(url, found)
        )

    @store.command()
    @broker_option
    @json_option
    @reports_errors
    def gc(broker: str | None, as_json: bool) -> None:
        """Evict least recently used entries that no live job pins down to the cap now, and say what was freed.

        On a farm it first releases the pins of jobs that failed, were cancelled or expired, counts entries an
        older farm wrote before the store had a cap, and deletes files of a file blob store (FARM_BLOB_STORE) that
        no entry owns and nothing touched for an hour."""
        from farm.errors import redact_url

        with open_chosen_store(broker) as chosen:
            released = _release_ended_jobs(broker, chosen)
            adopted = chosen.adopt_unaccounted()
            orphans = chosen.sweep_orphans()
            freed = chosen.evict()
            after = chosen.stats()
            url = chosen.url
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "store": redact_url(url),
                        "released_jobs": released,
                        "adopted_entries": adopted,
                        "orphan_files_deleted": orphans,
                        **freed.to_json(),
                        "stats": after.to_json(),
                    },
                    sort_keys=True,
                )
            )
            return
        if released:
            click.echo(f"released the pins of {len(released)} ended jobs: {', '.join(released)}")
        if adopted:
            click.echo(f"counted {adopted} entries written before the store had a cap")
        if orphans:
            click.echo(f"deleted {orphans} files of the blob store that no entry owned")
        click.echo(f"freed {freed.entries} entries, {human_bytes(freed.bytes)}")
        click.echo(describe(url, after))

    return store


def _release_ended_jobs(broker: str | None, chosen: Store) -> list[str]:
    """On a farm, release the pins of jobs that ended without a download to wait for; none without one."""
    if not broker:
        return []
    from farm.distributed.board import JobBoard
    from farm.distributed.pins import release_ended_jobs

    return release_ended_jobs(JobBoard(broker), chosen)
