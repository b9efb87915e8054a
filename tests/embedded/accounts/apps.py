from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "tests.embedded.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
