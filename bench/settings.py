"""The product's settings, serving more addresses: the benchmark's reference views
(bench/urls.py).

The product's views and their references run in the same gunicorn processes, through the
same middleware, on the same persistent database connections.
"""

from alwayson.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
# Persistent connections for both views (the product's default on PostgreSQL).
DATABASES["default"].setdefault("CONN_MAX_AGE", 60)  # noqa: F405
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # noqa: F405
