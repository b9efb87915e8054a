"""The product's addresses plus the references: views that do the HTTP work of the product's
view they stand beside (its authentication, session, CSRF check or signature) and then store
with one raw INSERT, with no validation, no lease, no wake-up, no rendering.

    /bench/raw/<slug>/                   the GitHub webhook: HMAC-SHA256 of the body checked
                                         against the same secret, the body parsed as JSON
    /bench/chat/<slug>/                  the chat form: logged-in session, CSRF token
    /bench/answer/<slug>/<request_id>/   an approval answer: logged-in session, CSRF token
"""

import hashlib
import hmac
import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from alwayson.urls import urlpatterns as product

RAW_INSERT = """
    INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts, claim_gen,
                             error, available_at, created, updated)
    SELECT id, %s, %s, %s::jsonb, 'pending', 0, NULL, '', now(), now(), now()
    FROM inbox_inbox WHERE slug = %s
    ON CONFLICT (inbox_id, source, source_id) DO NOTHING
"""


def _insert(source, key, payload_json, slug) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(RAW_INSERT, [source, key, payload_json, slug])
        return cursor.rowcount == 1


def _github_secrets():
    secrets = settings.ALWAYSON_GITHUB_SECRETS
    return [secrets] if isinstance(secrets, str) else list(secrets)


@csrf_exempt
def raw_insert(request, slug):
    body = request.body
    given = request.headers.get("X-Hub-Signature-256", "")
    signed = any(
        hmac.compare_digest(
            given, "sha256=" + hmac.new(s.encode(), body, hashlib.sha256).hexdigest()
        )
        for s in _github_secrets()
    )
    if not signed:
        return HttpResponse("bad signature", status=401)
    payload = {"type": request.headers["X-GitHub-Event"], "body": json.loads(body)}
    key = f"{request.headers['X-GitHub-Hook-ID']}:{request.headers['X-GitHub-Delivery']}"
    stored = _insert("raw", key, json.dumps(payload), slug)
    return JsonResponse({"stored": stored}, status=202 if stored else 200)


@login_required
@require_POST
def chat(request, slug):
    payload = {"text": request.POST["text"], "from": request.user.get_username()}
    _insert("chat", request.POST["message_id"], json.dumps(payload), slug)
    return HttpResponseRedirect(f"/inbox/{slug}/")


@login_required
@require_POST
def answer(request, slug, request_id):
    _insert("answer", request_id, json.dumps({"answer": request.POST["answer"]}), slug)
    return HttpResponseRedirect(f"/approvals/{slug}/{request_id}/")


urlpatterns = [
    path("bench/raw/<str:slug>/", raw_insert),
    path("bench/chat/<str:slug>/", chat),
    path("bench/answer/<str:slug>/<str:request_id>/", answer),
    *product,
]
