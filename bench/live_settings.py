"""bench/live.py's settings: the bench's (production's, DEBUG off), with static files found
where they are instead of in a collected manifest, since the measured pages link theirs, and
each web process's statements counted (bench/counting.py) when BENCH_STATEMENTS_DIR is set."""

from bench.settings import *  # noqa: F403

STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
WHITENOISE_USE_FINDERS = True
INSTALLED_APPS = [*INSTALLED_APPS, "bench.counting.StatementCounting"]  # noqa: F405
