"""The fixed instant tests pass as `now`, the steps they move it by, and a lease clock they move."""

from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


class Ticks:
    """A lease clock the test moves."""

    def __init__(self, at=1000.0):
        self.at = at

    def __call__(self):
        return self.at

    def move(self, seconds):
        self.at += seconds
