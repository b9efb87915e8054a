from django.apps import AppConfig


class ClaudeConfig(AppConfig):
    name = "alwayson.claude"
    label = "alwayson_claude"
    verbose_name = "Claude agent"

    def ready(self):
        from alwayson.ops import retention

        from . import retention as own_tables

        retention.register(self.label, own_tables.rules)
