"""Outbox rows as tests make and read them, and a webhook receiver for its webhook channel."""

import threading

from outbox.models import Channel, OutboxMessage
from tests.support.loopback import Loopback


def hold(inbox, body, at, urgent=False):
    return OutboxMessage.objects.create(inbox=inbox, body=body, created=at, urgent=urgent)


def statuses(inbox):
    return list(
        OutboxMessage.objects.filter(inbox=inbox).order_by("id").values_list("status", flat=True)
    )


def channel_for(inbox, **fields):
    channel, _ = Channel.objects.update_or_create(inbox=inbox, defaults=fields)
    return channel


class WebhookServer(Loopback):
    """A receiver on 127.0.0.1 answering `status` (after `delay` seconds) with `{}`."""

    def __init__(self):
        self.status = 200
        self.delay = 0.0
        self.release = threading.Event()  # set in teardown: a sleeping handler wakes up
        super().__init__(self._answer)

    def _answer(self, request):
        if self.delay:
            self.release.wait(self.delay)
        headers = {"Content-Type": "application/json"}
        status = self.status
        if isinstance(status, tuple):  # (3xx, location) for the first answer only
            (status, headers["Location"]), self.status = status, 200
        return status, headers, b"{}"

    def url(self, path="/hooks/alwayson"):
        return super().url(path)

    def posts(self):
        return [r for r in self.requests if r["method"] == "POST"]

    def start(self):
        return self.__enter__()

    def stop(self):
        self.release.set()
        self.__exit__()
