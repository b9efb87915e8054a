"""The admin as the tests drive it: a page's address, its messages, an action on rows, the
timer form's fields."""

from django.urls import reverse


def url(model, view, *args):
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def messages_of(response):
    return [str(message) for message in response.context["messages"]]


def post_action(client, model, action, objs, **extra):
    data = {"action": action, "_selected_action": [o.pk for o in objs], "index": 0, **extra}
    return client.post(url(model, "changelist"), data, follow=True)


def timer_form(inbox, **fields):
    data = {
        "inbox": inbox.pk,
        "key": "digest",
        "due": "",
        "every": "",
        "cron": "",
        "timezone": "UTC",
        "policy": "coalesce",
        "catch_up_max": "10",
        "payload": '{"task": "daily digest"}',
    }
    data.update(fields)
    return data
