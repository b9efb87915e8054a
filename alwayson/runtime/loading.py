from importlib import import_module
from types import ModuleType

from django.conf import settings
from django.utils.module_loading import import_string

# What an agent's path looks like, in every message that says the path is wrong.
EXAMPLE = "'myapp.agent.agent' (the function agent in myapp/agent.py)"


def load_agent(path: str | None = None, field: str = "ALWAYSON_AGENT"):
    """The callable `path` names; ValueError naming `field` and what a path must be."""
    path = path or settings.ALWAYSON_AGENT
    try:
        agent = import_string(path)
    except (ImportError, ValueError) as exc:  # ValueError: an empty module name (".x")
        module = _module(path)
        if module is not None:
            agent = module
        elif _missing_below(exc, path):
            # The path is right; a module the agent's own module imports is not installed.
            raise ValueError(f"{field}: cannot import {path!r}: {exc}") from None
        else:
            raise ValueError(
                f"{field}: cannot import {path!r}: {exc}. It must be the dotted path to a"
                f" callable that takes a Run, such as {EXAMPLE}"
            ) from None
    if isinstance(agent, ModuleType):
        named = getattr(agent, "agent", None)
        such_as = f"'{path}.agent'" if callable(named) else EXAMPLE
        raise ValueError(
            f"{field}: {path!r} is a module, not a callable: name the function (or other"
            f" callable) in it that takes a Run, such as {such_as}"
        )
    if not callable(agent):
        raise ValueError(
            f"{field}: {path!r} is not callable (a {type(agent).__name__}): it must be the"
            f" dotted path to a callable that takes a Run, such as {EXAMPLE}"
        )
    return agent


def _module(path: str) -> ModuleType | None:
    """The module `path` names, if it names one ("alwayson.demo.refund_desk" does: Django's
    import_string reads it as the attribute refund_desk of alwayson.demo, which a package
    has only once the module was imported)."""
    try:
        return import_module(path)
    except (ImportError, ValueError, TypeError):
        return None


def _missing_below(exc: Exception, path: str) -> bool:
    """Whether `exc` is a module the path's own module imports that is not installed, rather
    than a module of the path itself."""
    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not missing:
        return False
    return not (path == missing or path.startswith(f"{missing}."))
