from django.apps import AppConfig


class AlwaysonConfig(AppConfig):
    name = "alwayson"
    verbose_name = "alwayson runtime"
