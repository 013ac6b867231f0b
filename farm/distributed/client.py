"""The farm seen from a client (a laptop, CI): submit a model, follow, download and cancel jobs by id.

Every call goes through Redis only (the job board and the store), so any process or host that reaches the broker
can wait on, download or cancel a job that another one submitted. Waiting blocks on the job's events channel, which
the board publishes on at every state change and finished unit, with a slow poll behind it; a job that shows no
change is checked for queues that no live worker consumes (farm.distributed.fleet), so a farm without the right
workers is said, not sat out in silence.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from farm import defaults
from farm.backends.base import ANY_WORKER
from farm.backends.llvm.target import CpuTarget
from farm.backends.registry import Target, backend_of
from farm.distributed import acl, job_record, recipes, redis_keys, task_messages, uploads
from farm.distributed.board import JobBoard
from farm.distributed.job_record import TERMINAL, JobRecord, JobState, check_model_name
from farm.distributed.redis_keys import check_job_id
from farm.distributed.uploads import Upload
from farm.errors import (
    BadInputError,
    BuildError,
    CredentialsRefusedError,
    ExitStatus,
    FarmError,
    FarmStateError,
    JobError,
    UnreachableError,
)
from farm.frontend.split import BlobSource, SplitError, SplitModel, split_model
from farm.ir.shapes import PinnedShapes, sizes_to_json
from farm.store import CorruptEntryError, MissingEntryError, Store, content_key, open_store


def job_queues(record: JobRecord) -> dict[str, str]:
    """Every queue the job's tasks go to, each with how to get a worker for it: `control` always, each target's
    compile queue, and with --tune (until its tuning ran) each CPU target's tuning queue."""
    queues = {task_messages.CONTROL_QUEUE: ANY_WORKER}
    for target in record.targets:
        queues[task_messages.compile_queue(target)] = backend_of(target).served_by(target)
    if record.tuning_asked("tune") or record.tuning_asked("retune"):
        for target in record.targets:
            if target.kind == CpuTarget.kind:
                queues[task_messages.tune_queue(target.id)] = (
                    f"start 'farm worker' on a host of CPU class {target.id}, or its kernels keep the default variants"
                )
    return queues


class FarmClient:
    """A connection to one farm: its job board and store, both reached through the broker's Redis."""

    def __init__(self, broker: str) -> None:
        """`broker`: the farm's Redis URL; its user says the team this client submits for and lists
        (farm.distributed.acl.team_of_url)."""
        self.broker, self.team = broker, acl.team_of_url(broker)
        self.board = JobBoard(broker)
        self._store: Store | None = None
        self._prefetched: dict[str, dict[str, bytes]] = {}

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(defaults.store_url(self.broker)).for_team(self.team)
        return self._store

    def submit(
        self,
        model_path: str | os.PathLike,
        targets: Sequence[Target],
        no_cache: bool = False,
        tune: bool = False,
        retune: bool = False,
        sizes: Sequence[PinnedShapes] = (),
        on_upload: Callable[[Upload], None] | None = None,
    ) -> str:
        """Upload what the farm lacks of the model and submit the job's request to the workers' intake
        (farm.distributed.intake), which makes its record and plans it; returns the job id. `tune`: time the
        kernels the tuning database lacks first (`retune`: all of them), on workers of each target's CPU class.
        `sizes`: the sizes of dynamic input dimensions to build (farm.ir.shapes.parse_sizes).

        The model goes by digest (farm.frontend.split): its graph, and each weight (external data included) as a
        blob named by its sha256, staged only when the store lacks it (one round trip asks), streamed a chunk at a
        time; `on_upload(Upload)` hears how far the upload is. A resubmit whose weights didn't change uploads only
        its graph."""
        path = Path(model_path)
        if not path.is_file():
            raise BadInputError(f"{path}: no such model file")
        try:
            split = split_model(path)
        except (SplitError, OSError) as error:
            raise BadInputError(str(error)) from None
        refusal = uploads.over_the_cap(path.name, split.blob_bytes + len(split.graph), self.store.max_bytes)
        if refusal:
            raise BadInputError(refusal)
        now = time.time()
        job_id, request = job_record.encode_request(
            JobRecord(
                JobState.QUEUED,
                split.graph_key,
                check_model_name(path.stem),
                split.model_sha256,
                list(targets),
                no_cache=no_cache,
                tune=tune,
                retune=retune,
                sizes=list(sizes),
                submitted_from=os.uname().nodename[:255],
                created=now,
                updated=now,
            ),
            self.team,
        )
        if retune:
            self.board.grant_retune(job_id)  # before the upload: a submitter is refused with nothing sent
        uploaded = self._upload(split, on_upload or (lambda upload: None))
        self.board.submit_request(job_id, request, now)
        uploads.remember(job_id, split, uploaded)
        return job_id

    def _upload(self, split: SplitModel, report: Callable[[Upload], None]) -> int:
        """Stage the graph and the blobs the store lacks (asked in one round trip); the weight bytes sent. What the
        store had is asked for again after the uploads and staged if it was evicted meanwhile (once a worker
        accepts the job, its pins keep it)."""
        lacking = self.store.missing([split.graph_key, *split.blobs])
        missing = [key for key in lacking if key != split.graph_key]
        upload = Upload(
            len(split.blobs), split.blob_bytes, len(missing), sum(split.blobs[key].length for key in missing)
        )
        report(upload)
        admission = Admission(self, split) if self.store.streams_uploads() else None
        for key in missing:
            self._stage_blob(key, split.blobs[key], upload, report)
            if admission:
                admission.push(key, upload, report)
        asked_for = set(lacking)
        evicted = self.store.missing([key for key in (split.graph_key, *split.blobs) if key not in asked_for])
        for key in evicted:
            if key != split.graph_key:
                upload.missing_blobs, upload.missing_bytes = (
                    upload.missing_blobs + 1,
                    upload.missing_bytes + split.blobs[key].length,
                )
                self._stage_blob(key, split.blobs[key], upload, report)
        if split.graph_key in lacking or split.graph_key in evicted:
            self.store.stage(split.graph)
        upload.done = True
        report(upload)
        return upload.sent_bytes

    def admit_soon(self, token: str, key: str) -> None:
        """Ask the workers' intakes to admit a staged blob now (a streamed upload)."""
        self.board.call(self.board.redis.lpush, redis_keys.ADMIT_KEY, redis_keys.encode_admission(token, key))

    def _stage_blob(self, key: str, source: BlobSource, upload: Upload, report: Callable[[Upload], None]) -> None:
        def pieces() -> Iterator[memoryview]:
            for piece in source.chunks(self.store.piece_bytes):
                yield piece
                upload.sent_bytes += len(piece)
                report(upload)

        try:
            self.store.stage_stream(key, source.length, pieces())
        except OSError as error:
            raise BadInputError(f"reading the model's weights: {error}") from None

    def jobs(self, limit: int = 20) -> list[dict[str, Any]]:
        """The `limit` newest jobs of this client's team (redis_keys.jobs_key) of the last JOB_TTL_SECONDS, newest
        first: id, state, model, creation time and age. Ids whose record is gone are skipped; a record that doesn't decode is listed with its error."""
        now, offset = time.time(), 0
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            ids = self.board.call(
                self.board.redis.zrevrangebyscore,
                redis_keys.jobs_key(self.team),
                "+inf",
                now - defaults.JOB_TTL_SECONDS,
                start=offset,
                num=limit,
            )
            if not ids:
                break
            offset += len(ids)
            found += [entry for entry in (self._listed(job_id, now) for job_id in ids) if entry][: limit - len(found)]
        return found

    def _listed(self, job_id: str, now: float) -> dict[str, Any] | None:
        """One job as `farm jobs` lists it; None when its record is gone."""
        try:
            record = self.board.view(check_job_id(job_id))
        except (BadInputError, FarmStateError) as error:
            return {"job_id": job_id, "state": "unreadable", "error": str(error)}
        if record is None:
            return None
        return {
            "job_id": job_id,
            "state": record.state.value,
            "model": record.model_name,
            "created": record.created,
            "age_s": round(now - record.created, 1),
        }

    def record(self, job_id: str) -> JobRecord:
        """The job as clients see it: its record, or its request while no worker has accepted it. A name that is
        no job id is an unknown job (a submitter's user may read only its team's ids: farm.distributed.acl)."""
        if not redis_keys.JOB_ID.fullmatch(job_id):
            raise JobError(f"unknown job {job_id[:80]!r} (a job id is [<team>.]<16 hex digits>)")
        record = self.board.view(job_id)
        if record is None:
            raise JobError(f"unknown job {job_id!r} (never submitted to this farm, or expired)")
        return record

    def status(self, job_id: str) -> dict[str, Any]:
        """The job's state, compile tasks done of total, and the failing unit and error if it failed."""
        record = self.record(job_id)
        status: dict[str, Any] = {
            "job_id": job_id,
            "state": record.state.value,
            "model": record.model_name,
            "done": self.board.finished(job_id, "compile"),
            "total": record.total or 0,
            "kernels": record.kernels,
            "blobs": record.blobs,
            "targets": [target.id for target in record.targets],
            "sizes": sizes_to_json(record.sizes),
            "artifact_reused": record.cached,
        }
        for field in ("error", "failed_unit", "exit_status", "artifact_key", "tuning_note"):
            if getattr(record, field):
                status[field] = getattr(record, field)
        if record.tune_units is not None:
            status["tuning"] = {
                "done": self.board.finished(job_id, "tune"),
                "total": len(record.tune_units),
                "errors": record.tune_errors,
            }
        status["seconds"] = round((record.finished or record.updated) - record.created, 3)
        status["lost_workers"] = record.lost_workers
        return status

    def unserved_queues(self, job_id: str) -> dict[str, str]:
        """The queues of a live job that no live worker consumes, each with how to get one ({} once it ended)."""
        from farm.distributed.fleet import live_queues

        record = self.record(job_id)
        if record.is_over:
            return {}
        live = live_queues(self.broker)
        return {queue: hint for queue, hint in sorted(job_queues(record).items()) if queue not in live}

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_unserved: Callable[[dict[str, str]], None] | None = None,
        on_lost: Callable[[str, int], None] | None = None,
        prefetch: bool = False,
    ) -> dict[str, Any]:
        """Follow the job until it ends (or `timeout` seconds pass: then the last status, not ended), reading it
        again at each notification of the board (at most every POLL_SECONDS) or every wait_fallback_seconds().
        `on_unserved(queues)`: called soon after the start and whenever the job has shown no change for a while
        (LivenessWatch), with the job's queues that have newly lost (or never had) a live worker. `on_lost(worker,
        tasks)`: called once per worker the job lost (each incarnation), with the number of its tasks dispatched
        again, before the status that first shows it. `prefetch`: the caller downloads the artifact next, so the
        job's packed weights are made while it compiles (Prefetch). A lost Redis raises UnreachableError naming
        the job, so the user can resume with `farm wait`."""
        try:
            with JobEvents(self.board, job_id) as events, Prefetch(self, job_id, prefetch) as ahead:
                return self._follow(job_id, events, timeout, on_progress, on_unserved, on_lost, ahead.poke)
        except CredentialsRefusedError:
            raise  # the URL is wrong, not the farm away: nothing to resume
        except UnreachableError as error:
            raise UnreachableError(
                f"{error}; job {job_id} may still be running: once the farm is back, "
                f"'farm wait {job_id}' resumes waiting"
            ) from None

    def _follow(
        self,
        job_id: str,
        events: JobEvents,
        timeout: float | None,
        on_progress: Callable[[dict[str, Any]], None] | None,
        on_unserved: Callable[[dict[str, str]], None] | None,
        on_lost: Callable[[str, int], None] | None,
        on_change: Callable[[], None],
    ) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        watch = LivenessWatch(lambda: self.unserved_queues(job_id), on_unserved)
        next_nudge = time.monotonic() + INTAKE_NUDGE_SECONDS
        said_lost: set[str] = set()
        while True:
            status = self.status(job_id)
            on_change()
            if on_lost:
                _say_lost_once(status["lost_workers"], said_lost, on_lost)
            if on_progress:
                on_progress(status)
            now = time.monotonic()
            if JobState(status["state"]) in TERMINAL or (deadline is not None and now > deadline):
                return status
            watch.saw(status, now)
            if status["state"] == JobState.QUEUED.value and now >= next_nudge:
                if self.board.get(job_id) is None:
                    self.board.nudge(job_id)
                next_nudge = now + INTAKE_NUDGE_SECONDS
            pause = (
                defaults.wait_fallback_seconds()
                if deadline is None
                else min(defaults.wait_fallback_seconds(), deadline - now)
            )
            events.wait(max(0.0, min(pause, watch.next_check - time.monotonic(), next_nudge - time.monotonic())))

    def download(self, job_id: str, out_dir: str | os.PathLike) -> str:
        """Write the job's artifact to out_dir/<model>.farm (atomically) and return its path: the store keeps it as a
        recipe (farm.distributed.recipes), whose members are streamed into the file one at a time. Members this
        machine submitted (the model's own weights, when this client uploaded the job) are read from the model's
        files, and the packed weights made from them, each checked by sha256; only the rest (libraries, and what
        this machine doesn't hold) comes from the farm."""
        status = self.status(job_id)
        raise_for_state(status)
        if status["state"] != JobState.DONE.value:
            raise JobError(f"job {job_id} is {status['state']}: no artifact yet (farm wait {job_id})")
        path = os.path.abspath(os.path.join(out_dir, f"{status['model']}.farm"))
        try:
            recipes.write_artifact_from(
                path,
                recipes.read_recipe(self.store.peek(status["artifact_key"])),
                uploads.local_first(uploads.recall(job_id), self.store.peek),
                self._prefetched.pop(job_id, {}),
            )
        except MissingEntryError:
            raise JobError(
                f"job {job_id}'s artifact is no longer in the farm's store (evicted after its first "
                "download); submit the model again to rebuild it"
            ) from None
        except CorruptEntryError as error:
            self.board.call(self.board.redis.lpush, redis_keys.REPAIR_KEY, error.key)
            raise JobError(
                f"job {job_id}'s artifact: store entry {error.key} is damaged in the farm's store (its "
                "bytes have another sha256); the farm drops it now: submit the model again to rebuild "
                "it"
            ) from None
        self.board.raise_flag(job_id, redis_keys.downloaded_key)
        return path

    def cancel(self, job_id: str) -> bool:
        """Cancel a live job by raising its cancel flag: from then on it reads as cancelled and its queued tasks
        stop at their start; False when it had already ended."""
        if self.record(job_id).is_over:
            return False
        self.board.raise_flag(job_id, redis_keys.cancel_key)
        return self.record(job_id).state == JobState.CANCELLED


class Admission:
    """A streamed upload (farm.distributed.redis_keys.ADMIT_KEY): each staged blob is handed to the workers' intakes
    at once, and no more than FARM_UPLOAD_WINDOW_BYTES of staged bytes wait for them, so that Redis holds a window
    of the model, not all of it, when its blobs live in a file blob store."""

    def __init__(self, client: FarmClient, split: SplitModel) -> None:
        self.client, self.split = client, split
        team = client.team
        self.token, self.window = f"{team + '.' if team else ''}{secrets.token_hex(16)}", defaults.upload_window_bytes()
        self.waiting: list[str] = []

    def push(self, key: str, upload: Upload, report: Callable[[Upload], None]) -> None:
        """Hand `key` to the intakes, then wait while more than the window waits for them."""
        self.client.admit_soon(self.token, key)
        self.waiting.append(key)
        since = time.monotonic()
        while self._waiting_bytes() > self.window:
            if not upload.stalled and time.monotonic() - since > ADMISSION_PATIENCE_SECONDS:
                upload.stalled = True
                report(upload)
            time.sleep(defaults.POLL_SECONDS)
        upload.stalled = False

    def _waiting_bytes(self) -> int:
        self.waiting = self.client.store.staged(self.waiting)
        return sum(self.split.blobs[key].length for key in self.waiting)


class Prefetch:
    """While a client waits on a job: its packed weights, made before the link, up to FARM_PREFETCH_BYTES, held for
    the client's download of the job. The farm keeps a packed weight as its key and how it is made
    (farm.distributed.recipes), so once the job names its link plan each is made here with the workers' own step,
    from the model's files where this machine submitted the weight, else from the weight read from the store (one
    the plan folded). The download uses one only if it hashes to the recipe's key. A head start, never a
    requirement: a failure just leaves the member to the download."""

    def __init__(self, client: FarmClient, job_id: str, wanted: bool = True) -> None:
        """`wanted`: False for a client that won't download (then nothing is made)."""
        self.client, self.job_id = client, job_id
        self.budget = defaults.prefetch_bytes() if wanted else 0
        self.fetched: dict[str, bytes] = client._prefetched.setdefault(job_id, {})
        self.held = sum(map(len, self.fetched.values()))
        self.done = False
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="farm-prefetch", daemon=True)

    def __enter__(self) -> Prefetch:
        if self.budget > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def poke(self) -> None:
        """The job changed: look for its link plan."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set() and not self.done:
            self._wake.wait()
            self._wake.clear()
            try:
                self.done = self._make_from_link_plan()
            except (FarmError, OSError):
                return

    def _make_from_link_plan(self) -> bool:
        """Make the job's packed weights once it names its link plan; False before."""
        record = self.client.record(self.job_id)
        if record.link_plan_key is None:
            return False
        read = uploads.local_first(uploads.recall(self.job_id), self.client.store.peek)
        for derivation in recipes.derivations_in(self.client.store.peek(record.link_plan_key)):
            if self._stop.is_set() or self.held >= self.budget:
                break
            made = derivation.make(read(derivation.source))
            self.fetched[content_key(made)], self.held = made, self.held + len(made)
        return True


ADMISSION_PATIENCE_SECONDS = 10.0
"""How long a streamed upload waits for the workers to take a window in before it says that it waits."""
INTAKE_NUDGE_SECONDS = 30.0
"""A waiting client pushes its job's id to the intake again when no worker has accepted the job for this long (a
worker that popped it may have died; accepting twice does nothing)."""
SUBSCRIBE_SECONDS = 5.0
"""How long a waiting client waits for Redis to confirm its subscription (after that the slow poll still holds)."""


class JobEvents:
    """The board's notifications for one job (redis_keys.job_events_channel) on a pub/sub connection of its own.
    The subscription is confirmed before the first read of the job, so no change between the two is missed."""

    def __init__(self, board: JobBoard, job_id: str) -> None:
        self.board = board
        self.pubsub = board.redis.pubsub()
        board.call(self.pubsub.subscribe, redis_keys.job_events_channel(job_id))
        board.call(self.pubsub.get_message, timeout=SUBSCRIBE_SECONDS)

    def wait(self, seconds: float) -> bool:
        """Block until the job changes or `seconds` pass; True when it changed. Notifications that come within
        POLL_SECONDS of the first are taken with it, so a burst of finished units costs one read of the job."""
        if not self.board.call(self.pubsub.get_message, ignore_subscribe_messages=True, timeout=seconds):
            return False
        time.sleep(defaults.POLL_SECONDS)
        while self.board.call(self.pubsub.get_message, ignore_subscribe_messages=True, timeout=0):
            pass
        return True

    def __enter__(self) -> JobEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pubsub.close()


class LivenessWatch:
    """When a waiting client asks which of its job's queues no live worker consumes: LIVENESS_FIRST_CHECK_SECONDS
    after it starts (a job that a live farm ends at once, such as a cached artifact, is never held up by a check,
    which may ping every worker), then once the job has shown no change for LIVENESS_CHECK_SECONDS, the pause
    doubling after each check (up to LIVENESS_CHECK_MAX_SECONDS) while it still shows none, so a hundred stalled
    clients don't flood the workers. Each queue is reported when it becomes unserved, not at every check."""

    def __init__(self, unserved: Callable[[], dict[str, str]], report: Callable[[dict[str, str]], None] | None) -> None:
        self.unserved, self.report = unserved, report
        self.last: dict[str, Any] | None = None
        self.pause = defaults.LIVENESS_CHECK_SECONDS
        self.next_check = float("inf")
        self.reported: set[str] = set()

    def saw(self, status: dict[str, Any], now: float) -> None:
        """Note the job's status as read at `now`, and check its queues when it is time."""
        if self.report is None:
            return
        if self.last is None:
            self.next_check = now + defaults.LIVENESS_FIRST_CHECK_SECONDS
        elif status != self.last:
            self.pause = defaults.LIVENESS_CHECK_SECONDS
            self.next_check = now + self.pause
        self.last = status
        if now < self.next_check:
            return
        queues = self.unserved()
        fresh = {queue: hint for queue, hint in queues.items() if queue not in self.reported}
        self.reported = set(queues)
        if fresh:
            self.report(fresh)
        self.next_check = now + self.pause
        self.pause = min(2 * self.pause, defaults.LIVENESS_CHECK_MAX_SECONDS)


def _say_lost_once(lost: dict[str, int], said: set[str], on_lost: Callable[[str, int], None]) -> None:
    """Call `on_lost(worker name, tasks)` for each lost worker (by holder: a worker restarted under its name and lost
    again is another loss) not in `said`, and add it there."""
    for holder in sorted(set(lost) - said):
        said.add(holder)
        on_lost(holder.rpartition("#")[0], lost[holder])


def raise_for_state(status: dict[str, Any]) -> None:
    """Turn a failed or cancelled job into the error (and exit status) the CLI reports."""
    if status["state"] == JobState.FAILED.value:
        error = BadInputError if status.get("exit_status") == ExitStatus.BAD_INPUT else BuildError
        raise error(f"job {status['job_id']} failed: {status.get('error', 'unknown error')}")
    if status["state"] == JobState.CANCELLED.value:
        raise JobError(f"job {status['job_id']} was cancelled")
