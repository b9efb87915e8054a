from django.apps import AppConfig


class TimersConfig(AppConfig):
    name = "timers"
    verbose_name = "Timers"
