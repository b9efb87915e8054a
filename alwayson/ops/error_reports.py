"""What debug pages and error emails may show: no credential, whatever holds it.

Django's filter masks settings and request META entries whose names look secret (KEY, PASS,
TOKEN...). Credentials also travel inside URLs under innocent names: DATABASE_URL and
EMAIL_URL, which runserver copies from the environment into every request's META, and any
setting or variable holding `scheme://user:password@host`. This filter masks both.
"""

import re

from django.views.debug import SafeExceptionReporterFilter

# The password of a URL's user info: `scheme://user:` + password + `@`.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@/?#\s]+@")


class CredentialFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        SafeExceptionReporterFilter.hidden_settings.pattern + "|DATABASE_URL|EMAIL_URL|DSN",
        flags=re.IGNORECASE,
    )

    def cleanse_setting(self, key, value):
        # Django's own cleanse_setting recurses through dicts, lists and tuples by calling
        # this method, so a URL nested in DATABASES or a list is masked too.
        value = super().cleanse_setting(key, value)
        if isinstance(value, str):  # a lazy string passes too: str() evaluates it
            return _URL_PASSWORD.sub(rf"\g<head>{self.cleansed_substitute}@", str(value))
        return value
