"""`manage.py check --deploy`: a production deployment seals its worker."""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def check_sealed_worker(app_configs, **kwargs):
    if settings.ALWAYSON_EGRESS_SOCKET:
        return []
    return [
        Warning(
            "ALWAYSON_EGRESS_SOCKET is not set: the worker, where agent code runs, holds every "
            "credential of the deployment.",
            hint="Set ALWAYSON_EGRESS_SOCKET and run `manage.py runegress` "
            "(docs/how-to/egress.md#the-sealed-worker); the deploy files do.",
            id="alwayson_egress.W001",
        )
    ]
