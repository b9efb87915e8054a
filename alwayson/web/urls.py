"""alwayson's pages, their live updates, the approvals, the webhooks and the operator's
dashboard: what a project includes, under any prefix, to serve alwayson (alwayson/urls.py
does, at the root; docs/how-to/embed-in-a-project.md). Their names are not namespaced
("home", "inbox", ...) except approvals: and inbox: (the webhooks)."""

from django.urls import include, path

from alwayson.web import memory, streams, views
from alwayson.web.dashboard import dashboard
from alwayson.web.replays import replay_page

urlpatterns = [
    path("", views.home, name="home"),
    path("inbox/<slug:slug>/", views.inbox_page, name="inbox"),
    # The live pages' updates (alwayson/web/live.py): a poll and, under ASGI, a push.
    path("inbox/<slug:slug>/live/", streams.inbox_poll, name="inbox-live"),
    path("inbox/<slug:slug>/stream/", streams.inbox_stream, name="inbox-stream"),
    path("inbox/<slug:slug>/memory/", memory.memory_list, name="memory"),
    path("inbox/<slug:slug>/memory/<path:name>", memory.memory_file, name="memory-file"),
    path("runs/", views.run_list, name="runs"),
    path("runs/<slug:slug>/<int:generation>/", views.run_page, name="run"),
    path("approvals/live/", streams.approvals_poll, name="approvals-live"),
    path("approvals/stream/", streams.approvals_stream, name="approvals-stream"),
    path("approvals/", include("approvals.urls")),
    path("hooks/", include("inbox.urls")),
    # Ahead of the admin in alwayson/urls.py, whose catch-all would answer them.
    path("admin/dashboard/", dashboard, name="admin-dashboard"),
    path("admin/dashboard/live/", streams.dashboard_poll, name="dashboard-live"),
    path("admin/dashboard/stream/", streams.dashboard_stream, name="dashboard-stream"),
    path("admin/replay/", replay_page, name="admin-replay"),
]
