"""Celery entry point of the farm: `celery -A tasks.app` (the app is farm.distributed.celery_app)."""
