"""Requests carrying what the database cannot hold are refused before anything looks them up.

PostgreSQL's text cannot hold a NUL (psycopg refuses it before sending), so a NUL in a slug,
an approval id, an admin filter or search term, an autocomplete term or a session cookie used
to surface as a 500 there while SQLite answered 404. One check ahead of every view, the
session and the admin's lookups makes both databases answer the same, and no view has to
remember it: 404 for an address (no page has a NUL in its address), 400 with the reason for a
query string, a posted form or a header.
"""

from django.http import HttpResponseBadRequest, HttpResponseNotFound

from inbox.validation import UNSTORABLE

_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
_WHAT = "a NUL character or an unpaired surrogate, which cannot be stored or looked up"


def _refused(status_class, where):
    return status_class(f"{where} contains {_WHAT}", content_type="text/plain; charset=utf-8")


def _unstorable(*texts) -> bool:
    return any(UNSTORABLE.search(text) for text in texts)


def _unstorable_query(query) -> bool:
    return any(_unstorable(key, *values) for key, values in query.lists())


class RefuseUnstorableInput:
    """First in MIDDLEWARE: nothing before it reads the database.

    The address, the query string and the cookies (the session's key among them) are checked
    for every request, one that no view answers included. The other headers and a posted form
    are checked where CsrfViewMiddleware would read the form: a CSRF-exempt view (the webhooks)
    reads its raw body and headers itself, under its own size limit, and refuses what it cannot
    store with its own answer (inbox/webhooks.py), so they are left to it.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if _unstorable(request.path, request.path_info):
            return _refused(HttpResponseNotFound, "the address")
        if _unstorable_query(request.GET):
            return _refused(HttpResponseBadRequest, "the query string")
        # Parsed, not the raw header: a quoted cookie spells a NUL as \000.
        if _unstorable(*request.COOKIES.keys(), *request.COOKIES.values()):
            return _refused(HttpResponseBadRequest, "a cookie")
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        if getattr(view_func, "csrf_exempt", False):
            return None
        headers = [value for key, value in request.META.items() if key.startswith("HTTP_")]
        if _unstorable(*(value for value in headers if isinstance(value, str))):
            return _refused(HttpResponseBadRequest, "a header")
        posts_a_form = request.method == "POST" and request.content_type in _FORM_TYPES
        if posts_a_form and _unstorable_query(request.POST):
            return _refused(HttpResponseBadRequest, "the posted form")
        return None
