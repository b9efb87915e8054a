"""alwayson's own settings, for a Django project that installs alwayson's apps beside its own
(docs/how-to/embed-in-a-project.md):

    from alwayson.settings.embedded import *  # noqa: F403

gives that project every setting alwayson's apps read, with alwayson's defaults, read from
the same environment variables, and nothing else: not INSTALLED_APPS, MIDDLEWARE, DATABASES,
TEMPLATES or any other setting of Django's, which stay the project's own. Set any of them
after the import to override it.

The django-axes settings are alwayson's login throttle (accounts.py); the project's logins
are throttled by them only if it installs axes as alwayson does.
"""

from django.conf import global_settings

from alwayson import settings as _alwayson

# alwayson's own names, the model's and Sentry's (read by alwayson.claude and alwayson.ops),
# and django-axes' (its retention prunes by AXES_COOLOFF_TIME).
_PREFIXES = ("ALWAYSON_", "ANTHROPIC_", "SENTRY_", "AXES_")

__all__ = sorted(
    name
    for name in dir(_alwayson)
    if name.startswith(_PREFIXES) and not hasattr(global_settings, name)
)
globals().update({name: getattr(_alwayson, name) for name in __all__})
