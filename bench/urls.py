"""The product's addresses plus the reference: a view that stores a delivery with one raw
INSERT, no signature check, no validation, no lease, no wake-up."""

from django.db import connection
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from alwayson.urls import urlpatterns as product

RAW_INSERT = """
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts, claim_gen,
                             error, available_at, created, updated)
    SELECT id, 'raw', %s, %s::jsonb, 'pending', 0, NULL, '', now(), now(), now()
    FROM inbox_inbox WHERE slug = %s
    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
"""


@csrf_exempt
def raw_insert(request, slug):
    with connection.cursor() as cursor:
        cursor.execute(RAW_INSERT, [request.headers["X-Key"], request.body.decode(), slug])
        stored = cursor.rowcount == 1
    return JsonResponse({"stored": stored}, status=202 if stored else 200)


urlpatterns = [path("bench/raw/<str:slug>/", raw_insert), *product]
