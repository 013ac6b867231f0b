"""The farm: the wire protocol, the job board, the steps workers run, the client, the Celery app."""
