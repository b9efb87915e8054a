"""The admin site: Django's, with the demo's models in a section of their own.

The refund desk's ledger (Refund) lives in the alwayson app beside the product's tables, but
it is the example's, not the product's: the index and the sidebar show it last, under "Demo",
so an operator does not take it for part of alwayson. Only the listing moves; the model, its
table and its URLs stay where they are (no migration).
"""

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig

# Models shown under DEMO_SECTION instead of their app, as "app_label.modelname".
DEMO_MODELS = {"alwayson.refund"}
DEMO_SECTION = "Demo: the refund desk (example payments system)"


class AlwaysonAdminSite(admin.AdminSite):
    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        demo = []
        for app in apps:
            is_demo = [
                f"{app['app_label']}.{model['object_name'].lower()}" in DEMO_MODELS
                for model in app["models"]
            ]
            demo += [m for m, d in zip(app["models"], is_demo, strict=True) if d]
            app["models"] = [m for m, d in zip(app["models"], is_demo, strict=True) if not d]
        apps = [app for app in apps if app["models"]]
        if demo:
            apps.append(
                {
                    "name": DEMO_SECTION,
                    "app_label": "demo",
                    "app_url": demo[0]["admin_url"],
                    "has_module_perms": True,
                    "models": demo,
                }
            )
        return apps


class AlwaysonAdminConfig(AdminConfig):
    """django.contrib.admin with this site as admin.site (in settings.INSTALLED_APPS)."""

    default_site = "alwayson.admin_site.AlwaysonAdminSite"
