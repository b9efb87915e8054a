from django.apps import AppConfig


class TracingConfig(AppConfig):
    name = "alwayson.tracing"
    label = "alwayson_tracing"

    def ready(self):
        # Once per process, web and loops alike; a no-op unless an OTLP endpoint is set.
        from alwayson import tracing

        tracing.configure()
