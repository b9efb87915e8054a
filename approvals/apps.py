from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self):
        from inbox.signals import reserved_event_stored

        from .models import record_answer

        reserved_event_stored.connect(record_answer, dispatch_uid="approvals.record_answer")
