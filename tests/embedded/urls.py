"""The stranger's URLs: its own admin and login pages, alwayson's under /agents/."""

from django.contrib import admin
from django.http import HttpResponse
from django.urls import include, path

# Django's admin index, with alwayson's link to its dashboard (embed-in-a-project.md).
admin.site.index_template = "alwayson/admin/index.html"


def acme_home(request):
    return HttpResponse("Acme's own home page")


urlpatterns = [
    path("", acme_home, name="acme-home"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("agents/", include("alwayson.web.urls")),
]
