"""The ASGI application, for an ASGI server (`uvicorn alwayson.asgi:application`), which serves
the live pages' streams (alwayson/web/live.py) too. The production web process serves
alwayson.wsgi instead, with alwayson/web/serving.py's workers (alwayson/ops/processes.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alwayson.settings")
# Each request's view runs on a thread of its own here: its PostgreSQL connection comes from
# the process's pool and goes back to it (alwayson/settings/database.py), not one kept per
# thread, which would leave a session open per request served.
os.environ.setdefault("ALWAYSON_DB_POOL_SIZE", "10")
application = get_asgi_application()
