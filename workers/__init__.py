"""Worker entry point of the farm: `farm worker` runs farm.distributed.worker.run_worker."""
