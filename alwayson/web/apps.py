from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "alwayson.web"
    label = "alwayson_web"
    verbose_name = "pages"

    def ready(self):
        from alwayson.ops import retention

        from . import retention as own_tables

        retention.register(self.label, own_tables.rules)
