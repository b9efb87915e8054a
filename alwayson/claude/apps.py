from django.apps import AppConfig
from django.conf import settings

from alwayson.runtime.policy import check_policy_syntax
from inbox.validation import checked_setting


def checked_policy(name, policy):
    """Setting `name`'s permission policy."""
    return checked_setting(name, check_policy_syntax, policy)


class ClaudeConfig(AppConfig):
    name = "alwayson.claude"
    label = "alwayson_claude"
    verbose_name = "Claude agent"

    def ready(self):
        from alwayson.ops import retention

        from . import retention as own_tables

        # Here, not in the settings, which import no app: every process stops at start-up on
        # a malformed default policy, not when a Claude agent first reads it.
        checked_policy("ALWAYSON_CLAUDE_POLICY", settings.ALWAYSON_CLAUDE_POLICY)
        retention.register(self.label, own_tables.rules)
