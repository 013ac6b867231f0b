"""The farm's Celery app as `celery -A tasks.app` finds it (Flower, `celery inspect`); it lives in
farm.distributed.celery_app."""

from farm.distributed.celery_app import app

__all__ = ["app"]
