"""Celery tasks of the farm (not yet written).

This package will hold the Celery app and thin tasks that hand a submitted model to farm's compiler and
store the resulting artifact; the build logic itself stays in the `farm` package.
"""
