import json
from datetime import UTC, datetime, time
from pathlib import Path

from django.core.management.base import CommandError

from alwayson.claude.replay import STUB, recorded_runs, replay
from alwayson.command import AlwaysonCommand
from alwayson.runtime.loading import load_agent
from alwayson.runtime.models import AgentConfigRevision
from inbox.models import Inbox


def moment(text: str, field: str) -> datetime:
    """A date (its UTC midnight) or an ISO datetime (UTC when it names no zone)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"{field}: {text!r} is not a date (2026-12-01) or a datetime (2026-12-01T09:30)"
        ) from None
    if len(text) <= len("2026-12-01"):
        value = datetime.combine(value.date(), time())
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Command(AlwaysonCommand):
    help = (
        "Replay recorded runs against a candidate agent and/or configuration revision, "
        "committing nothing: what each run did, what the candidate would do, and the "
        "differences, printed and saved as JSON (docs/how-to/replay.md)."
    )

    def add_arguments(self, parser):
        which = parser.add_argument_group("which recorded runs")
        which.add_argument("--inbox", action="append", default=[], help="an inbox's slug")
        which.add_argument("--since", help="started from this date or datetime (UTC)")
        which.add_argument("--until", help="started before this date or datetime (UTC)")
        which.add_argument(
            "--outcome", action="append", default=[], help="done, error, deferred (default all 3)"
        )
        which.add_argument("--ran-agent", default="", help="run by this agent (dotted path)")
        which.add_argument("--ran-code", default="", help="run by this code fingerprint")
        which.add_argument("--ran-config", type=int, help="run under this configuration revision")
        which.add_argument("--limit", type=int, default=50, help="at most this many (oldest first)")
        candidate = parser.add_argument_group("the candidate")
        candidate.add_argument("--agent", default="", help="dotted path of the candidate agent")
        candidate.add_argument(
            "--config-revision",
            type=int,
            help="the inbox's configuration revision to run (a proposed one, or any other)",
        )
        parser.add_argument(
            "--budget",
            type=int,
            required=True,
            help="most model calls to pay for (a call the recorded run made is free)",
        )
        parser.add_argument(
            "--stub", default=STUB, help="what a tool call not in the journal returns"
        )
        parser.add_argument(
            "--out", default="replay-report.json", help="where to save the report (JSON)"
        )

    def handle(self, *args, **options):
        if options["budget"] < 0:
            raise CommandError(f"--budget must be 0 or more model calls, not {options['budget']}")
        if options["limit"] < 1:
            raise CommandError(f"--limit must be a positive integer, not {options['limit']}")
        missing = sorted(
            set(options["inbox"])
            - set(Inbox.objects.filter(slug__in=options["inbox"]).values_list("slug", flat=True))
        )
        if missing:
            raise CommandError(f"--inbox: no inbox {', '.join(missing)}")
        if options["agent"]:
            try:
                load_agent(options["agent"], field="--agent")
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        since = moment(options["since"], "--since") if options["since"] else None
        until = moment(options["until"], "--until") if options["until"] else None
        if since and until and since >= until:
            raise CommandError(f"--since ({since}) must be before --until ({until})")
        revision = None
        if options["config_revision"] is not None:
            if len(options["inbox"]) != 1:
                raise CommandError("--config-revision: name the one inbox it is of with --inbox")
            revision = AgentConfigRevision.objects.filter(
                inbox__slug=options["inbox"][0], number=options["config_revision"]
            ).first()
            if revision is None:
                raise CommandError(
                    f"--config-revision: inbox {options['inbox'][0]} has no revision "
                    f"{options['config_revision']}"
                )
        try:
            records = recorded_runs(
                inboxes=options["inbox"],
                since=since,
                until=until,
                outcomes=options["outcome"],
                agent=options["ran_agent"],
                code=options["ran_code"],
                config_revision=options["ran_config"],
            )[: options["limit"]]
            report = replay(
                records,
                agent=options["agent"],
                revision=revision,
                budget=options["budget"],
                stub=options["stub"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for line in report.lines():
            self.stdout.write(line)
        out = Path(options["out"])
        out.write_text(json.dumps(report.as_json(), indent=2, ensure_ascii=False, default=str))
        self.stdout.write(f"saved: {out}")
