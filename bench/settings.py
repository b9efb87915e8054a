"""The product's settings, serving one more address for the benchmark's reference view.

Both the real webhook endpoint and the reference run in the same gunicorn processes, through
the same middleware, on the same persistent database connections.
"""

from alwayson.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
# Persistent connections for both views (the product's default on PostgreSQL).
DATABASES["default"].setdefault("CONN_MAX_AGE", 60)  # noqa: F405
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # noqa: F405
