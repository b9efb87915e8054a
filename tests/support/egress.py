"""The egress gateway's services as the tests configure them, planted credentials to search
for afterwards, and a loopback service's answers."""

import gzip
import io
import json
import time
import zipfile

from django.apps import apps

from alwayson.egress.services import check_services

SECRET = "sk_live_PLANTED-7c1f9e3a5b"  # distinctive: searched for everywhere afterwards
QUERY_SECRET = "qk_PLANTED-44d0b2"


def services_for(service_url, **overrides):
    config = {
        "payments": {
            "base_url": service_url,
            "methods": ["GET", "POST"],
            "paths": ["/v1/refunds", "/v1/redirect", "/v1/echo", "/v1/big"],
            "secret_env": "PAYMENTS_TOKEN",
            # The gateway's default: an answer from the loopback server on a machine running
            # three suites at once took over a second (a ReadTimeout in CI at 1).
            "timeout": 10,
            "max_bytes": 1000,
        },
        # /v1/slow answers after 1.5 s: past this service's timeout.
        "payments-slow": {
            "base_url": service_url,
            "paths": ["/v1/slow"],
            "secret_env": "PAYMENTS_TOKEN",
            "timeout": 0.5,
        },
        "maps": {
            "base_url": service_url + "/maps",
            "paths": ["/geocode"],
            "secret_env": "MAPS_KEY",
            "query": "key",
        },
        "desk-only": {"base_url": service_url, "paths": ["/v1/refunds"], "inboxes": ["desk"]},
    }
    config.update(overrides)
    return check_services(config)


def every_stored_value():
    """Every row of every table, as text."""
    for model in apps.get_models():
        for row in model.objects.all().values():
            yield f"{model._meta.label} {row!r}"


def answer(request):
    path = request["path"]
    if path.startswith("/v1/redirect"):
        return 302, {"Location": request["headers"]["X-Evil"]}, b""
    if path.startswith(("/v1/echo/gzip", "/v1/echo/zip")):
        # The same echo inside compressed content that does not say so in Content-Encoding:
        # an agent opens it itself (issue 38).
        seen = json.dumps({"seen": request["headers"].get("Authorization", "")}).encode()
        if path.startswith("/v1/echo/gzip"):
            return 200, {"Content-Type": "application/gzip"}, gzip.compress(seen)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("seen.json", seen)
        return 200, {"Content-Type": "application/zip"}, out.getvalue()
    if path.startswith("/v1/echo"):
        # A service that reflects what it received: the credential must not come back.
        seen = request["headers"].get("Authorization", "")
        body = json.dumps({"seen": seen}).encode()
        return 200, {"X-Seen": seen, "Set-Cookie": "sid=1"}, body, f"Seen {seen}"
    if path.startswith("/v1/big"):
        return 200, {}, b"x" * 5000
    if path.startswith("/v1/slow"):
        time.sleep(1.5)
        return 200, {}, b"{}"
    return 200, {"Content-Type": "application/json"}, b'{"refund": "re_1"}'
