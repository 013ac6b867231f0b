"""A worker's intake: the thread that turns submitted job ids into jobs.

Submitters are not trusted, and a Celery queue is no place for their words: a message there may name any task, and
its routing (which Redis restores it by) is whatever the sender wrote. So submitters write no queue at all
(farm.distributed.acl). A client writes its job's request (redis_keys.request_key) and pushes the job's id on one
list (redis_keys.SUBMITTED_KEY); the intake of every worker pops ids from it (each id reaches one worker) and accepts
the job (farm.distributed.intake_steps.IntakeSteps.accept), which checks the request, makes the record and
dispatches the planning from the worker's own credentials. An id popped by a worker that dies before accepting it is
pushed again by the client that waits on the job (farm.distributed.client.INTAKE_NUDGE_SECONDS); accepting is
idempotent.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from farm.distributed import redis_keys
from farm.distributed.board import JobBoard
from farm.errors import BadInputError, FarmStateError, UnreachableError

log = logging.getLogger(__name__)

POP_SECONDS = 1.0
"""How long one pop blocks, so that a stopping worker's intake ends within about that."""
SWEEP_SECONDS = 10.0
"""How often the intake runs the store's housekeeping (farm.distributed.intake_steps.IntakeSteps.housekeep)."""


SUBMITTED_BATCH = 1000
"""Submitted ids one pop takes at most (farm.distributed.intake.Intake._accept)."""


def _text(raw: Any) -> str:
    return raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)


class Intake(threading.Thread):
    """Pops submitted ids and calls `accept(job_id)` (returning a note it logs) for each well-formed one, blobs of
    streamed uploads (`admit(token, key)`) and damaged store entries (`repair(key)`) likewise; runs `housekeep()`
    every SWEEP_SECONDS between pops."""

    def __init__(
        self,
        board: JobBoard,
        accept: Callable[[str], str],
        housekeep: Callable[[], None] = lambda: None,
        admit: Callable[[str, str], str] = lambda token, key: "",
        repair: Callable[[str], str] = lambda key: "",
    ) -> None:
        super().__init__(name="farm-intake", daemon=True)
        self.board, self.accept, self.housekeep, self.admit, self.repair = board, accept, housekeep, admit, repair
        self.handlers: dict[str, Callable[[Any], str]] = {
            redis_keys.SUBMITTED_KEY: self._accept,
            redis_keys.ADMIT_KEY: self._admit,
            redis_keys.REPAIR_KEY: self._repair,
        }
        self._stopping = threading.Event()
        self._swept = time.monotonic()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.take_one()
            except Exception:  # noqa: BLE001 - logged; a worker whose intake ended would accept no job
                log.exception("intake: a pop failed")
                time.sleep(POP_SECONDS)
            self.sweep()

    def sweep(self) -> None:
        """Run the housekeeping when SWEEP_SECONDS have passed since the last run; no error ends the thread."""
        if time.monotonic() - self._swept < SWEEP_SECONDS:
            return
        self._swept = time.monotonic()
        try:
            self.housekeep()
        except Exception:  # noqa: BLE001 - logged; a Redis away or a bad record must not stop the intake
            log.warning("intake: housekeeping failed", exc_info=True)

    def take_one(self) -> str | None:
        """Pop one submitted id, blob to admit or entry to repair (waiting up to POP_SECONDS) and handle it; the
        note, or None when nothing came. Nothing a submitter pushes, and no error, ends the thread: a worker without
        intake would accept no job."""
        try:
            popped = self.board.call(self.board.redis.brpop, list(self.handlers), timeout=POP_SECONDS)
        except UnreachableError as error:
            log.warning("intake: %s", error)
            time.sleep(POP_SECONDS)
            return None
        except FarmStateError as error:  # WRONGTYPE: an intake list is some other value
            return self._drop_what_is_not_a_list(error)
        if not popped:
            return None
        return self.handlers[_text(popped[0])](popped[1])

    def _drop_what_is_not_a_list(self, error: Exception) -> str:
        """Delete each intake key that holds anything but a list (the farm's ACL lets submitters only push on them,
        but an operator's mistake or an older farm's may have SET one): while one does, no pop works, so every
        worker's intake would accept nothing. The note says what was there."""
        try:
            dropped = self.board.drop_mistyped({name: "list" for name in self.handlers})
        except (FarmStateError, UnreachableError) as failure:
            dropped, error = {}, failure
        note = (
            f"deleted {', '.join(f'{name} (a {kind})' for name, kind in dropped.items())}: an intake key must be a list"
            if dropped
            else f"a pop failed: {error}"
        )
        log.warning("intake: %s", note)
        time.sleep(0 if dropped else POP_SECONDS)
        return note

    def _admit(self, raw: Any) -> str:
        return self._handle(raw, lambda: self.admit(*redis_keys.decode_admission(raw)), "an admission", "admitting")

    def _repair(self, raw: Any) -> str:
        return self._handle(raw, lambda: self.repair(redis_keys.decode_repair(raw)), "a repair", "repairing")

    def _accept(self, raw: Any) -> str:
        """Accept the popped id and up to SUBMITTED_BATCH - 1 more from the list: ids that are malformed, have no
        request or have a record already are skipped with one note for them all, after one round trip for the
        batch. A submitter may push any number of junk ids (50,000 in 0.2 s made a 2 s build take 40 s when each
        cost its round trips and its log line); a junk id now costs a few microseconds of a worker."""
        more = self.board.call(self.board.redis.rpop, redis_keys.SUBMITTED_KEY, SUBMITTED_BATCH - 1) or []
        popped = list(dict.fromkeys(_text(raw) for raw in [raw, *more]))
        well_formed = [job_id for job_id in popped if redis_keys.JOB_ID.fullmatch(job_id)]
        waiting = self.board.awaiting_acceptance(well_formed)
        notes = [
            self._handle(job_id, functools.partial(self.accept, job_id), "a submission", "accepting")
            for job_id in waiting
        ]
        skipped = len(popped) - len(waiting)
        if skipped:
            notes.append(
                f"skipped {skipped} submitted id(s): {len(popped) - len(well_formed)} malformed, the rest "
                "with no request (never submitted, expired or refused) or accepted already"
            )
            log.info("intake: %s", notes[-1])
        return "; ".join(notes)

    @staticmethod
    def _handle(raw: Any, handle: Callable[[], str], what: str, doing: str) -> str:
        """Run `handle` on what a submitter pushed and log its note: a malformed entry is refused, and no error
        ends the thread (it must outlive any one submission or upload)."""
        try:
            note = handle()
        except BadInputError as error:
            note = f"refused {what}: {error}"
        except Exception as error:  # noqa: BLE001 - logged; the thread must outlive any one submission
            log.exception("intake: %s %r failed", doing, raw)
            note = f"{doing} {str(raw)[:40]!r} failed: {type(error).__name__}: {error}"
        log.info("intake: %s", note)
        return note

    def stop(self) -> None:
        self._stopping.set()
