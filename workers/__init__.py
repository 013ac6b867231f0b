"""Worker start-up: detect what this host can build for, choose the queues, run a Celery worker (`farm worker`)."""
