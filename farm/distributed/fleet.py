"""The farm's workers as clients and steps see them: who is alive, what they advertise, which queues they
consume. Capabilities (and queues) come from the hash each worker writes when it starts (protocol.WORKERS_KEY).
`list_workers` asks Celery's inspect which workers answer a ping now (a second's wait, for `farm workers`); the
quick questions (which queues have a live worker, which OpenCL devices the farm owns) go by the workers' leases
(farm.distributed.leases): one read, no waiting, and a worker whose host died drops out when its lease lapses."""

from __future__ import annotations

from typing import Any

from farm.distributed import protocol
from farm.distributed.board import JobBoard
from farm.errors import UnreachableError, redact_url


def list_workers(broker: str, timeout: float = 1.0) -> list[dict[str, Any]]:
    """Live workers (those answering a ping) with their host, capabilities and queues."""
    from kombu.exceptions import OperationalError

    from farm.distributed.celery_app import make_app

    board = JobBoard(broker)
    capabilities = board.call(board.redis.hgetall, protocol.WORKERS_KEY)
    try:
        queues = make_app(broker).control.inspect(timeout=timeout).active_queues() or {}
    except OperationalError as error:
        raise UnreachableError(f"farm unreachable at {redact_url(broker)}: {error}") from None
    return [{**protocol.decode_capabilities(capabilities.get(name)), "name": name,
             "queues": sorted(q["name"] for q in qs)} for name, qs in sorted(queues.items())]


def leased_workers(broker: str) -> dict[str, dict[str, Any]]:
    """The advertisements of the workers that hold a lease now, by name."""
    board = JobBoard(broker)
    advertised = board.call(board.redis.hgetall, protocol.WORKERS_KEY)
    names = sorted(advertised)
    leases = board.call(board.redis.mget, [protocol.lease_key(name) for name in names]) if names else []
    return {name: protocol.decode_capabilities(advertised[name]) for name, lease in zip(names, leases) if lease}


def live_queues(broker: str) -> set[str]:
    """The queues that live workers consume now."""
    return {queue for capabilities in leased_workers(broker).values() for queue in capabilities.get("queues", [])}


def farm_fingerprints(broker: str) -> list[str]:
    """Fingerprints of every OpenCL device that a live worker owns (sorted, each once)."""
    return sorted({device["fingerprint"] for capabilities in leased_workers(broker).values()
                   for device in capabilities.get("opencl", [])})
