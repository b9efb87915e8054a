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


# The agent configuration's page carries its model settings inline (alwayson/claude/admin.py).
MODEL_SETTINGS = "model_settings"


def agent_config_form(inbox, *, initial_settings=0, **fields):
    """The agent configuration page's fields, its model settings inline (max_tokens,
    temperature, thinking_budget, tool_choice: blank unless given); `initial_settings`: 1 when
    the configuration has its settings row already (its change page)."""
    settings_fields = ("max_tokens", "temperature", "thinking_budget", "tool_choice")
    data = {
        "inbox": inbox.pk,
        "agent": "alwayson.claude.agent",
        "model": "",
        "system_prompt": "",
        "tools": "",
        "policy": "{}",
        "daily_token_budget": "",
        "approval_window": "",
        "mid_run": "queue",
        f"{MODEL_SETTINGS}-TOTAL_FORMS": "1",
        f"{MODEL_SETTINGS}-INITIAL_FORMS": str(initial_settings),
        f"{MODEL_SETTINGS}-MIN_NUM_FORMS": "0",
        f"{MODEL_SETTINGS}-MAX_NUM_FORMS": "1",
        f"{MODEL_SETTINGS}-0-config": inbox.pk if initial_settings else "",
    }
    data |= {f"{MODEL_SETTINGS}-0-{name}": "" for name in settings_fields}
    for name, value in fields.items():
        key = f"{MODEL_SETTINGS}-0-{name}" if name in settings_fields else name
        data[key] = value
    return data
