"""Requests carrying what the database cannot hold are refused before anything looks them up.

PostgreSQL's text cannot hold a NUL (psycopg refuses it before sending). One check ahead of
every view, the session and the admin's lookups makes both databases answer the same, and no
view has to remember it: 404 for an address, 400 with the reason for a query string, a posted
form or a header.
"""

from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import ValidationError
from django.db import connection
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


class RefuseBadAdminInput:
    """What the admin's own views would answer with a 500 or a silent redirect is 400 with
    the reason. The admin's views carry their ModelAdmin (`view.model_admin`), so one check
    here covers every changelist, ours and Django's own (users, groups). After
    CsrfViewMiddleware: a forged post is refused as such first.

    - An action posted with a selected id that is not an id: Django filters `pk__in` with
      the posted values as they come, and "x" raises a ValueError, an id past the column's
      range an OverflowError (SQLite).
    - A changelist filter naming a field or value the list does not have (`?id__in=x`):
      Django redirects to the unfiltered list (`?e=1`), saying nothing.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            getattr(request, "_admin_changelist", False)
            and response.status_code == 302
            and response.get("Location", "").endswith(f"?{ERROR_FLAG}=1")
        ):
            query = request.META.get("QUERY_STRING", "")
            return HttpResponseBadRequest(
                f"this list cannot be filtered by {query[:200]!r}: a filter names a field or"
                f" a value it does not have. The whole list: {request.path}",
                content_type="text/plain; charset=utf-8",
            )
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        model_admin = getattr(view_func, "model_admin", None)
        if model_admin is None:
            return None
        request._admin_changelist = view_func.__name__ == "changelist_view"
        if request.method != "POST" or request.content_type not in _FORM_TYPES:
            return None
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        pk = model_admin.model._meta.pk
        what = model_admin.opts.verbose_name
        for value in selected:
            if not _is_pk(pk, value):
                return HttpResponseBadRequest(
                    f"selected row id {value[:40]!r} is not an id of {what}",
                    content_type="text/plain; charset=utf-8",
                )
        return None


def _is_pk(field, value) -> bool:
    try:
        pk = field.to_python(value)
    except ValidationError:
        return False
    if pk is None:
        return False
    internal = field.get_internal_type()
    if isinstance(pk, int) and internal.endswith(("AutoField", "IntegerField")):
        low, high = connection.ops.integer_field_range(internal)
        return (low is None or pk >= low) and (high is None or pk <= high)
    return True
