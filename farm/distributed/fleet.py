"""The farm's workers as clients and steps see them: who is alive, what they advertise, which queues they
consume. Live means answering a ping now (Celery's inspect); capabilities come from the hash each worker writes
when it starts (protocol.WORKERS_KEY)."""

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
    return [{"name": name, "queues": sorted(q["name"] for q in qs),
             **protocol.decode_capabilities(capabilities.get(name))} for name, qs in sorted(queues.items())]


def live_queues(broker: str) -> set[str]:
    """The queues that live workers consume now."""
    return {queue for worker in list_workers(broker) for queue in worker["queues"]}


def farm_fingerprints(broker: str) -> list[str]:
    """Fingerprints of every OpenCL device that a worker advertises (sorted, each once)."""
    board = JobBoard(broker)
    advertised = board.call(board.redis.hgetall, protocol.WORKERS_KEY).values()
    return sorted({device["fingerprint"] for text in advertised
                   for device in protocol.decode_capabilities(text).get("opencl", [])})
