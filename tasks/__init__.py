"""Celery entry point of the farm: `celery -A tasks.app` (the tasks are farm.distributed.tasks)."""
