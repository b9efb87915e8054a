from django.contrib import admin
from django.urls import include, path

from alwayson.web import views

urlpatterns = [
    # alwayson's pages (alwayson/web/urls.py: what a project embedding alwayson includes).
    path("", include("alwayson.web.urls")),
    # Ahead of django.contrib.auth.urls, which would answer the same address unthrottled.
    path(
        "accounts/password_reset/",
        views.ThrottledPasswordResetView.as_view(),
        name="password_reset",
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("favicon.ico", views.favicon),
]
