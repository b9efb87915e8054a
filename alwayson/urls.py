from django.contrib import admin
from django.urls import include, path

from alwayson.web import views
from alwayson.web.dashboard import dashboard

urlpatterns = [
    path("", views.home, name="home"),
    path("inbox/<slug:slug>/", views.inbox_page, name="inbox"),
    path("approvals/", include("approvals.urls")),
    path("hooks/", include("inbox.urls")),
    # Ahead of django.contrib.auth.urls, which would answer the same address unthrottled.
    path(
        "accounts/password_reset/",
        views.ThrottledPasswordResetView.as_view(),
        name="password_reset",
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/dashboard/", dashboard, name="admin-dashboard"),
    path("admin/", admin.site.urls),
]
