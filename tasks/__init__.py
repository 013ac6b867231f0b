"""Celery tasks of the farm: `tasks.app` holds the app (configured in one place) and thin tasks over farm.jobs."""
