"""Webhook endpoints, mounted under /hooks/ by alwayson/urls.py.

Each is also answered without its trailing slash: a POST there would otherwise meet
CommonMiddleware's APPEND_SLASH, which raises under DEBUG and otherwise redirects, and a
sender does not follow a redirect with its POST.
"""

from django.urls import path, re_path

from . import views

app_name = "inbox"

urlpatterns = [
    path("github/<str:slug>/", views.github, name="github"),
    path("stripe/<str:slug>/", views.stripe, name="stripe"),
    path("standard/<str:slug>/", views.standard, name="standard"),
    re_path(r"^github/(?P<slug>[^/]+)$", views.github),
    re_path(r"^stripe/(?P<slug>[^/]+)$", views.stripe),
    re_path(r"^standard/(?P<slug>[^/]+)$", views.standard),
]
