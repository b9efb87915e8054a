"""The embedded project's own suite: a pytest process of its own, started by
tests/contracts/test_embedded_project.py as

    DJANGO_SETTINGS_MODULE=tests.embedded.settings \
        python -m pytest tests/embedded -p alwayson.testing --confcutdir tests/embedded

so that it loads alwayson's test kit as any project's suite would, and not the main suite's
conftest (which does not collect this directory: tests/conftest.py)."""


def pytest_report_header(config):
    """Which database the project's suite ran on (the parent test checks it)."""
    from django.db import connection

    return f"embedded project database: {connection.vendor}"
