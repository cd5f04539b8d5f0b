"""What the backend and the worker share, so that neither imports the other: the Settings both
read, the Celery app and task names both sides of the queue use, the embedded broker's
transport, and the parent-death signal both set on the processes they start."""
