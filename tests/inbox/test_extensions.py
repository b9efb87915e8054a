"""An app adds to an app below it through an Extension, in its ready(): one way, read in one
place (inbox/extensions.py, docs/explanation/architecture.md "Extension points")."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from alwayson.claude.models import ModelSettings
from alwayson.egress.admin import outbound_services
from alwayson.egress.channels import send_slack, send_telegram
from alwayson.ops.retention import table_rules
from alwayson.runtime.models import AgentConfig, revision_parts
from approvals.services import edit_checks
from inbox.extensions import Extension, claim_extras, inbox_admin_fields
from outbox.channels import send_email, send_webhook, senders


def test_a_name_added_twice_with_two_values_is_refused_naming_both():
    point = Extension("what the test adds")
    point.add("a", 1)
    point.add("a", 1)  # ready() may run again

    with pytest.raises(ImproperlyConfigured, match=r"what the test adds: 'a' is added twice"):
        point.add("a", 2)
    assert point == {"a": 1}


def test_what_each_app_adds_is_there_once_the_apps_are_ready():
    assert claim_extras["agent"].startswith(f"SELECT agent FROM {AgentConfig._meta.db_table}")
    assert claim_extras["config_revision"].startswith(
        f"SELECT revision FROM {AgentConfig._meta.db_table}"
    )
    assert senders == {
        "email": send_email,
        "webhook": send_webhook,
        "slack": send_slack,
        "telegram": send_telegram,
    }
    assert list(edit_checks) == ["claude"]
    assert set(table_rules) == {"alwayson", "alwayson_claude", "alwayson_web"}
    assert revision_parts == {"model_settings": ModelSettings.revision_part}
    assert inbox_admin_fields == {"outbound_services": outbound_services}
