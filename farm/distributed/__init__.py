"""The farm: its Redis keys, task messages and job records, the job board, the steps workers run, the client, the
Celery app."""
