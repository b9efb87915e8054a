from django.conf import settings
from django.utils.module_loading import import_string


def load_agent(path: str | None = None, field: str = "ALWAYSON_AGENT"):
    path = path or settings.ALWAYSON_AGENT
    try:
        agent = import_string(path)
    except (ImportError, ValueError) as exc:  # ValueError: an empty module name (".x")
        raise ValueError(f"{field}: cannot import {path!r}: {exc}") from None
    if not callable(agent):
        raise ValueError(f"{field}: {path!r} is not callable")
    return agent
