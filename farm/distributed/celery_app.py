"""The farm's Celery app, configured in one place with the settings production needs; the tasks that run on it
are in farm.distributed.tasks (the app of `celery -A tasks.app`)."""

from __future__ import annotations

from celery import Celery

from farm import defaults
from farm.distributed.task_messages import CONTROL_QUEUE, FIXED_QUEUES


def make_app(broker: str | None = None) -> Celery:
    """A Celery app for the broker (default: FARM_BROKER_URL): JSON only, acks late and rejected on a lost worker,
    prefetch 1, time limits, a visibility timeout longer than the hard limit, events for Flower. A rediss://
    URL's TLS options (farm.defaults.redis_tls_options) also go to broker_use_ssl and redis_backend_use_ssl, where
    Celery's backend and Flower's queue view read them."""
    url = broker or defaults.broker_url() or "redis://127.0.0.1:6379/0"
    app = Celery("farm", broker=url, backend=url)
    tls = defaults.redis_tls_options(url)
    if tls:
        app.conf.update(broker_use_ssl=tls, redis_backend_use_ssl=tls)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=defaults.task_soft_time_limit(),
        task_time_limit=defaults.task_time_limit(),
        broker_transport_options={
            "visibility_timeout": defaults.visibility_timeout(),
            "socket_connect_timeout": 3,
            "unacked_restore_throttle": 1,
        },
        result_backend_transport_options={"visibility_timeout": defaults.visibility_timeout()},
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        task_routes={name: {"queue": queue} for name, queue in FIXED_QUEUES.items()},
        task_default_queue=CONTROL_QUEUE,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app
