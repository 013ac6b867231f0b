"""The farm's workers as clients and steps see them: who is alive, what they advertise, which queues they
consume. Capabilities (and queues) come from the hash each worker writes when it starts (redis_keys.WORKERS_KEY);
who is alive goes by the workers' leases (farm.distributed.leases): one read, no waiting, and a worker whose host
died drops out when its lease lapses. Nothing here asks the workers themselves (Celery's inspect broadcasts a
control message, which a submitter's credentials may not send: farm.distributed.acl)."""

from __future__ import annotations

from typing import Any

from farm.backends.registry import BACKENDS
from farm.distributed import redis_keys
from farm.distributed.board import JobBoard


def list_workers(broker: str) -> list[dict[str, Any]]:
    """Live workers (those holding a lease) with their host, capabilities and queues, by name."""
    return [
        {**capabilities, "name": name, "queues": sorted(capabilities.get("queues", []))}
        for name, capabilities in sorted(leased_workers(broker).items())
    ]


def leased_workers(broker: str) -> dict[str, dict[str, Any]]:
    """The advertisements of the workers that hold a lease now, by name."""
    board = JobBoard(broker)
    advertised = board.call(board.redis.hgetall, redis_keys.WORKERS_KEY)
    names = sorted(advertised)
    leases = board.call(board.redis.mget, [redis_keys.lease_key(name) for name in names]) if names else []
    return {name: redis_keys.decode_capabilities(advertised[name]) for name, lease in zip(names, leases) if lease}


def live_queues(broker: str) -> set[str]:
    """The queues that live workers consume now."""
    return {queue for capabilities in leased_workers(broker).values() for queue in capabilities.get("queues", [])}


def farm_device_ids(broker: str, kind: str) -> list[str]:
    """The ids of every device of a backend's kind that a live worker owns (sorted, each once): what `--target
    opencl` means on the farm."""
    backend = BACKENDS[kind]
    return sorted(
        {
            device
            for capabilities in leased_workers(broker).values()
            if kind in capabilities
            for device in backend.device_ids(capabilities[kind])
        }
    )
