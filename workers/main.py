"""`farm worker`'s entry point for scripts that start workers themselves; it lives in farm.distributed.worker."""

from farm.distributed.worker import run_worker

__all__ = ["run_worker"]
