"""The staff page of `manage.py replay`: recorded runs of one inbox replayed against a
candidate, committing nothing (alwayson/claude/replay.py), the report shown on the page."""

from datetime import timedelta

from django import forms
from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.shortcuts import render

from alwayson.claude.replay import STUB, recorded_runs, replay
from alwayson.runtime.loading import load_agent
from alwayson.runtime.models import AgentConfigRevision
from alwayson.web.runs import day_field, midnight
from inbox.models import Inbox, RunRecord

# A page's replay waits for the model in the request: a few runs, a small budget.
MOST_RUNS = 20
MOST_CALLS = 50


class ReplayForm(forms.Form):
    inbox = forms.ModelChoiceField(queryset=Inbox.objects.order_by("slug"), to_field_name="slug")
    since = day_field("Started from")
    until = day_field("Started until")
    outcome = forms.ChoiceField(
        choices=[("", "done, error or deferred"), *RunRecord.Outcome.choices[:3]], required=False
    )
    agent = forms.CharField(
        required=False, max_length=200, label="Candidate agent (dotted path; blank: the inbox's)"
    )
    config_revision = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1, label="Candidate configuration revision"
    )
    budget = forms.IntegerField(
        min_value=0, max_value=MOST_CALLS, initial=10, label="Model calls it may pay for"
    )
    limit = forms.IntegerField(
        min_value=1, max_value=MOST_RUNS, initial=5, label="Runs, oldest first"
    )

    def clean_agent(self):
        path = self.cleaned_data["agent"]
        if path:
            try:
                load_agent(path, field="agent")
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return path

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            raise forms.ValidationError("“Started from” is after “Started until”.")
        number, inbox = cleaned.get("config_revision"), cleaned.get("inbox")
        if number is not None and inbox is not None:
            revision = AgentConfigRevision.objects.filter(inbox=inbox, number=number).first()
            if revision is None:
                self.add_error("config_revision", f"{inbox.slug} has no revision {number}")
            cleaned["revision"] = revision
        return cleaned

    def replayed(self):
        data = self.cleaned_data
        records = recorded_runs(
            inboxes=[data["inbox"].slug],
            since=midnight(data["since"]) if data.get("since") else None,
            until=midnight(data["until"] + timedelta(days=1)) if data.get("until") else None,
            outcomes=[data["outcome"]] if data.get("outcome") else [],
        )[: data["limit"]]
        return replay(
            records,
            agent=data["agent"],
            revision=data.get("revision"),
            budget=data["budget"],
            stub=STUB,
        )


@staff_member_required
# What the candidate would do with an inbox's real traffic: for staff who may change agent
# configurations (it pays for model calls), not any staff user (403).
@permission_required("alwayson.change_agentconfig", raise_exception=True)
def replay_page(request):
    report, status = None, 200
    if request.method == "POST":
        form = ReplayForm(request.POST)
        if form.is_valid():
            report = form.replayed()
        else:
            status = 400
    else:
        form = ReplayForm()
    context = {
        **admin.site.each_context(request),
        "title": "Replay",
        "form": form,
        "report": report,
        "lines": report.lines() if report else [],
    }
    return render(request, "alwayson/admin/replay.html", context, status=status)
