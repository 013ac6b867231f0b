"""Farm workers (not yet written).

This package will hold worker start-up: configuring a Celery worker process and detecting the capabilities
of its machine (CPU features, OpenCL devices) so that builds are routed to workers that can serve them.
"""
