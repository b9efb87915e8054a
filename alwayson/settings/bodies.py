"""Request bodies: the largest any view accepts, which the production web refuses to read past
(alwayson/web/serving.py), and what Django keeps in memory rather than on disk."""

from django.conf import global_settings

from .webhooks import ALWAYSON_WEBHOOK_MAX_BYTES

# Django's cap on a form's body (request.POST, request.body): its default, 2.5 MiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = global_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
# The largest body any view accepts: a webhook's or a form's. The production web answers 413
# to a request that declares more as soon as its headers arrive, without reading the body, and
# cuts a chunked body there.
ALWAYSON_REQUEST_MAX_BYTES = max(ALWAYSON_WEBHOOK_MAX_BYTES, DATA_UPLOAD_MAX_MEMORY_SIZE)
# A file uploaded in a body the web lets through stays in memory (Django writes a larger one to
# a temporary file): nothing a request sends reaches the disk.
FILE_UPLOAD_MAX_MEMORY_SIZE = ALWAYSON_REQUEST_MAX_BYTES
