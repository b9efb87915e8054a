"""Fixtures of the inbox tests."""

import pytest


@pytest.fixture
def secrets(settings):
    """The webhook secrets of tests/support/webhooks.py, configured for every scheme."""
    from tests.support.webhooks import GITHUB_SECRET, STANDARD_SECRET, STRIPE_SECRET

    settings.ALWAYSON_GITHUB_SECRETS = [GITHUB_SECRET]
    settings.ALWAYSON_STRIPE_SECRETS = [STRIPE_SECRET]
    settings.ALWAYSON_STANDARD_SECRETS = [STANDARD_SECRET]
    settings.ALWAYSON_WEBHOOK_INBOX_SECRETS = {}
    return settings
