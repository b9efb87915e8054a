"""How an app adds to an app below it, which never imports it.

The lower app declares an Extension: what may be added, by name. The upper app adds to it in
its AppConfig.ready(), under the comment "What this app adds to the apps below", so a reader
finds everything an app adds in one method, and every extension point is listed in
docs/explanation/architecture.md ("Extension points"). Adding in ready(), not at import,
means the order Django loads modules in cannot change what is there.
"""

from django.core.exceptions import ImproperlyConfigured


class Extension(dict):
    """Values by name that apps above add to (`add`) and this app reads."""

    def __init__(self, what: str, **built_in):
        super().__init__(built_in)
        self.what = what

    def add(self, name: str, value) -> None:
        """Add `value` under `name`; ImproperlyConfigured when another value has that name
        already (two apps claiming one name is a mistake, not an override). Adding the same
        value again is allowed: ready() may run twice (a test's override_settings)."""
        present = self.get(name, value)
        if present is not value and present != value:
            raise ImproperlyConfigured(
                f"{self.what}: {name!r} is added twice ({present!r}, then {value!r})"
            )
        self[name] = value

    def __repr__(self):
        return f"<Extension {self.what}: {', '.join(self) or 'nothing added'}>"


# Subqueries the worker's take reads with the claim, by name ("agent": which agent runs the
# inbox), each SQL returning one value for the claimed inbox `t.inbox_id`; a run finds them
# in Claim.extras. PostgreSQL's take only (inbox/backends/postgresql.py): elsewhere, empty.
claim_extras = Extension("what the worker's take reads with a claim")

# Read-only fields the admin's inbox page shows beyond its own: functions of the inbox,
# decorated with admin.display(description=...).
inbox_admin_fields = Extension("what the admin's inbox page shows")
