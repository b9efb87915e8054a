"""`manage.py check --deploy`: the database keeps what it acknowledged (durability.py)."""

from django.core.checks import Warning, register

from . import durability


@register("database_durability", deploy=True)
def check_durability(app_configs, **kwargs):
    found = durability.read()
    # A database the check cannot reach (a build step without it, say) is not judged here.
    if found.status in (durability.OK, durability.EMBEDDED) or found.reasons == (
        durability.UNREADABLE,
    ):
        return []
    hint = "docs/how-to/production.md#a-database-that-keeps-what-it-acknowledged"
    if found.status == durability.UNKNOWN:
        return [
            Warning(
                "Could not tell whether the database can lose an acknowledged commit: "
                + "; ".join(found.reasons),
                hint=hint,
                id="alwayson_ops.W002",
            )
        ]
    return [
        Warning(
            "The database can lose commits it acknowledged: " + "; ".join(found.reasons),
            hint=f"Set synchronous_commit = on and list every standby a failover may promote in"
            f" synchronous_standby_names ({hint}).",
            id="alwayson_ops.W001",
        )
    ]
