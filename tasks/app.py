"""The farm's Celery app as `celery -A tasks.app` finds it (Flower, `celery inspect`): the app of
farm.distributed.tasks, configured in farm.distributed.celery_app."""

from farm.distributed.tasks import app

__all__ = ["app"]
