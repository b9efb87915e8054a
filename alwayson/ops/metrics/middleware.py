"""/metrics, behind a bearer token (ALWAYSON_METRICS_TOKEN)."""

import hmac
import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST

from .collector import exposition

log = logging.getLogger("alwayson.metrics")


class MetricsMiddleware:
    """Answers /metrics early (like /healthz), before the host check and the HTTPS redirect:
    a Prometheus server scrapes a web process at its own address over a private network.

    Off (404) unless ALWAYSON_METRICS_TOKEN is set; then 401 without the bearer token, 403
    with a wrong one (constant time), 503 while the database is unavailable. No redirect to
    HTTPS for the right token: it has already crossed in the clear, and a redirect would only
    break the scrape (docs/how-to/operations.md#metrics).
    """

    PATHS = ("/metrics", "/metrics/")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info not in self.PATHS:
            return self.get_response(request)
        token = settings.ALWAYSON_METRICS_TOKEN
        if not token:
            raise Http404("metrics are off: ALWAYSON_METRICS_TOKEN is not set")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            response = HttpResponse(
                "a bearer token is required\n", status=401, content_type="text/plain"
            )
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            return HttpResponse("wrong token\n", status=403, content_type="text/plain")
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        try:
            body = exposition()
        except DatabaseError:
            log.warning("metrics: the database is unavailable", exc_info=True)
            return HttpResponse("database unavailable\n", status=503, content_type="text/plain")

        response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
        response["Cache-Control"] = "no-store"
        return response
