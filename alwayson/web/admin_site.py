"""The admin site: Django's, named for alwayson, with the demo's app listed last.

The refund desk's ledger (Refund) is the example's, not the product's: the index and the
sidebar show its app after every other, so an operator does not take it for part of alwayson.
"""

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig

from alwayson.demo.apps import DemoConfig

DEMO_SECTION = DemoConfig.verbose_name


class AlwaysonAdminSite(admin.AdminSite):
    # On every admin page (templates/admin/base_site.html), the accounts' password pages too.
    site_header = "alwayson administration"
    site_title = "alwayson admin"
    index_title = "alwayson site administration"
    # Django's index with a link to the dashboard, under alwayson's name: a project's own
    # admin/index.html (the project's templates come first) stays the project's.
    index_template = "alwayson/admin/index.html"

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        return sorted(apps, key=lambda app: app["app_label"] == DemoConfig.label)


class AlwaysonAdminConfig(AdminConfig):
    """django.contrib.admin with this site as admin.site (in settings.INSTALLED_APPS)."""

    default_site = "alwayson.web.admin_site.AlwaysonAdminSite"
