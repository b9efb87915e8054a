"""The fixed instant tests pass as `now`, and the steps they move it by."""

from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
