"""The benchmark harness's own logic (bench/): its table, the ceiling's parser, the goals
evaluator, the --only parser, the statistics phases and the drain's server CPU. No timing is
measured or asserted here; the rates are made up. The phases' catalog checks and the server's
CPU need PostgreSQL (postgres_only)."""

import io

import pytest

from bench import ceiling, common, goals, phases, run

# What pgbench 15 prints for `-n -f insert.sql -c 8 -j 8 -T 5` (trimmed of nothing).
PGBENCH_15 = """\
pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: /tmp/tmpa1/insert.sql
scaling factor: 1
query mode: prepared
number of clients: 8
number of threads: 8
maximum number of tries: 1
duration: 5 s
number of transactions actually processed: 42707
number of failed transactions: 0 (0.000%)
latency average = 0.936 ms
initial connection time = 12.481 ms
tps = 8541.402817 (without initial connection time)
"""


def entry(key, phase, alwayson, reference, **extras):
    return common.row(key, alwayson, reference, "events/s", 0.9, key=key, phase=phase, **extras)


# --- the ceiling -----------------------------------------------------------------------------


def test_the_ceiling_is_pgbenchs_tps_without_connection_time():
    assert ceiling.parse_tps(PGBENCH_15) == pytest.approx(8541.402817)


def test_pgbench_output_without_a_tps_line_is_refused_with_the_output():
    broken = PGBENCH_15.replace("tps = 8541.402817 (without initial connection time)\n", "")
    with pytest.raises(ValueError, match="no 'tps = ...") as raised:
        ceiling.parse_tps(broken)
    assert "number of clients: 8" in str(raised.value)


def test_pgbench_runs_the_one_insert_script_quietly_with_one_thread_per_client(tmp_path):
    command = ceiling.pgbench_command(
        "postgres://someone@db.example:6543/bench_x", 8, 5, tmp_path / "insert.sql"
    )
    assert command[1:] == [
        "-n", "-M", "prepared", "-f", str(tmp_path / "insert.sql"),
        "-c", "8", "-j", "8", "-T", "5",
        "-h", "db.example", "-p", "6543", "-U", "someone", "bench_x",
    ]  # fmt: skip
    assert ceiling.SCRIPT.count(";") == 1 and ceiling.SCRIPT.startswith("INSERT INTO")


def test_a_rate_is_a_fraction_of_the_ceiling_at_its_connections_or_the_nearest_below():
    found = {1: 1000.0, 2: 1600.0, 8: 4000.0}
    assert ceiling.fraction(500, 1, found) == 0.5
    assert ceiling.fraction(800, 2, found) == 0.5
    assert ceiling.fraction(800, 4, found) == 0.5  # no 4-client figure: the 2-client one
    assert ceiling.fraction(2000, 8, found) == 0.5
    assert ceiling.fraction(2000, 8, {}) is None  # the ceiling did not run
    assert ceiling.fraction(None, 8, found) is None


# --- the table -------------------------------------------------------------------------------


def test_the_table_shows_the_phase_both_rates_the_ratio_the_goal_and_the_ceiling_fractions():
    rows = [
        entry("ingest by slug", "fresh", 450.0, 1500.0, clients=1),
        entry("ingest by id", "marked", 1400.0, 1500.0, clients=1),
        {"measure": "drain", "alwayson": 5000.0, "reference": 500.0, "unit": "events/s",
         "ratio": 10.0, "goal": 5},
    ]  # fmt: skip
    run.add_ceiling_fractions(rows, {1: 3000.0, 2: 5000.0, 8: 9000.0})
    out = io.StringIO()
    common.print_table(rows, out)
    lines = out.getvalue().splitlines()

    assert [cell.strip() for cell in lines[0].split("|")] == common.HEADER
    assert set(lines[1]) <= {"-", "+"}
    cells = [[cell.strip() for cell in line.split("|")] for line in lines[2:]]
    assert cells[0] == [
        "ingest by slug", "fresh", "450 events/s", "1,500 events/s", "0.30", ">= 0.9", "no",
        "0.15 / 0.50",
    ]  # fmt: skip
    assert cells[1][1] == "marked" and cells[1][4:7] == ["0.93", ">= 0.9", "yes"]
    assert cells[2][1] == "-" and cells[2][7] == "-"  # no phase, no connections given
    # Every column starts at the same place on every line.
    starts = {tuple(i for i, c in enumerate(line) if c == "|") for line in lines if "|" in line}
    assert len(starts) == 1


def test_the_markdown_table_has_a_header_a_rule_and_one_line_per_row():
    text = common.markdown_table(["a", "b"], [["1", "2"], ["3", "4"]])
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | 2 |", "| 3 | 4 |"]


# --- the goals -------------------------------------------------------------------------------


def by_measure(lines):
    return {line["measure"]: line for line in lines}


def test_a_goal_on_a_ratio_counts_the_worst_phase():
    rows = [
        entry("duplicate.slug", "fresh", 300.0, 3000.0),
        entry("duplicate.slug", "marked", 2900.0, 3000.0),
    ]
    line = by_measure(goals.evaluate(rows))["duplicate by slug, any statistics"]
    assert line["ratio"] == pytest.approx(0.1)
    assert line["value"] == "0.10 (worst: fresh statistics)"
    assert line["met"] == "no"

    rows[0] = entry("duplicate.slug", "fresh", 2800.0, 3000.0)
    line = by_measure(goals.evaluate(rows))["duplicate by slug, any statistics"]
    assert line["ratio"] == pytest.approx(2800 / 3000)
    assert line["met"] == "yes"


def test_slug_against_id_compares_alwayson_rates_within_each_phase():
    rows = [
        entry("ingest.id.1", "fresh", 1000.0, 2000.0),
        entry("ingest.slug.1", "fresh", 950.0, 1000.0),
        entry("ingest.id.1", "marked", 2000.0, 2000.0),
        entry("ingest.slug.1", "marked", 1700.0, 2000.0),
    ]
    line = by_measure(goals.evaluate(rows))["ingest by slug vs by id, 1 connection"]
    # 0.95 under fresh statistics, 0.85 under marked: the worst is marked's, below 0.9.
    assert line["ratio"] == pytest.approx(0.85)
    assert line["value"] == "0.85 (worst: marked statistics)"
    assert line["met"] == "no"


CHAT_4 = "chat form post, production web, 4 connections, any statistics"
PAGES = "50 open pages (Chromium): reply visible after its commit"


def test_a_goal_exactly_at_its_threshold_is_met():
    rows = [entry("web.chat.4", "marked", 90.0, 100.0)]
    assert by_measure(goals.evaluate(rows))[CHAT_4]["met"] == "yes"


def test_a_goal_whose_rows_did_not_run_says_so_and_is_not_met():
    lines = by_measure(goals.evaluate([]))
    assert lines[CHAT_4]["met"] == goals.NOT_MEASURED
    assert lines[CHAT_4]["value"] == "- (not in this run)"
    for name in (PAGES, "p99 of the webhook", "oversize declared body, none sent"):
        assert lines[name]["met"] == goals.NOT_MEASURED
        assert lines[name]["value"] == "- (not in this run)"


# bench/live.py's rows, as it writes them (the figures the goals read).
def live_rows(p50, p99, cpu_per_change, per_page, reach_p99, idle_cpu, idle_statements, n=500):
    return [
        {"key": "live.pages", "p50_ms": p50, "p99_ms": p99, "pages": 50},
        {"key": "live.polled", "p50_ms": 480, "p99_ms": 1040, "pages": 50},
        {
            "key": "live.streams",
            "streams": n,
            "cpu_ms_per_change": cpu_per_change,
            "statements_per_change": 4.0,
            "statements_per_page_per_change": per_page,
            "p99_ms": reach_p99,
            "missed": 0,
        },
        {
            "key": "live.idle",
            "streams": n,
            "seconds": 30,
            "cpu_percent": idle_cpu,
            "statements": idle_statements,
        },
    ]


def test_a_change_s_statements_count_once_per_web_process_that_read_it():
    """The pages at 50 streams may all sit in one web process and at 500 in both: the second
    process's own read of each change is not a statement per page."""
    from bench.live import cost

    one_reading = cost((0.0, 0.0, 10, {"101": 10, "102": 0}), (1.0, 0.1, 28, {"101": 28}), 2)
    both_reading = cost((0.0, 0.0, 0, {"101": 0}), (1.0, 0.1, 36, {"101": 18, "102": 18}), 2)

    assert (one_reading["processes_reading"], both_reading["processes_reading"]) == (1, 2)
    assert one_reading["statements_per_change"] == 9.0
    assert both_reading["statements_per_change"] == 18.0
    per_process = [r["statements_per_change_per_process"] for r in (one_reading, both_reading)]
    assert per_process == [9.0, 9.0]


LIVE_GOALS = (
    PAGES,
    "open streams: web CPU per change, in all",
    "open streams: statements per page per change",
    "open streams: a change reaches every stream",
    "idle open streams",
)


def test_the_live_goals_read_the_pushed_pages_the_streams_and_the_idle_cost():
    lines = by_measure(goals.evaluate(live_rows(67, 124, 31, 0.0, 420, 1.2, 0)))
    assert [lines[name]["met"] for name in LIVE_GOALS] == ["yes"] * 5
    assert lines[PAGES]["value"] == "p50 67 ms, p99 124 ms"  # the pushed row, not the polled
    assert lines["open streams: web CPU per change, in all"]["value"] == "31 ms at 500 streams"
    assert lines["idle open streams"]["value"] == (
        "1.2 % of a core, 0 statements (500 streams, 30 s)"
    )


@pytest.mark.parametrize(
    "figures, failing",
    [
        ((151, 124, 31, 0.0, 420, 1.2, 0), PAGES),
        ((67, 501, 31, 0.0, 420, 1.2, 0), PAGES),
        ((67, 124, 51, 0.0, 420, 1.2, 0), "open streams: web CPU per change, in all"),
        ((67, 124, 31, 7.0, 420, 1.2, 0), "open streams: statements per page per change"),
        ((67, 124, 31, 0.0, 1001, 1.2, 0), "open streams: a change reaches every stream"),
        ((67, 124, 31, 0.0, 420, 2.1, 0), "idle open streams"),
        ((67, 124, 31, 0.0, 420, 1.2, 1), "idle open streams"),
    ],
)
def test_a_live_goal_past_its_bound_is_not_met(figures, failing):
    lines = by_measure(goals.evaluate(live_rows(*figures)))
    assert {name for name in LIVE_GOALS if lines[name]["met"] == "no"} == {failing}


def test_fewer_streams_than_the_goals_are_for_say_so_instead_of_meeting_them():
    lines = by_measure(goals.evaluate(live_rows(67, 124, 31, 0.0, 420, 1.2, 0, n=100)))
    assert lines["idle open streams"]["met"] == "at 100 streams only"
    assert lines["open streams: web CPU per change, in all"]["met"] == "at 100 streams only"
    # Whether a statement runs per page does not depend on how many are open.
    assert lines["open streams: statements per page per change"]["met"] == "yes"


def web_row(key, connections, phase, p99_ratio):
    return {"key": key, "connections": connections, "phase": phase, "p99_ratio": p99_ratio}


def test_a_p99_goal_takes_the_worst_row_and_says_which():
    rows = [
        web_row("web.webhook.4", 4, "fresh", 1.2),
        web_row("web.webhook.16", 16, "marked", 1.7),
        web_row("web.webhook.4", 4, "marked", 1.1),
        web_row("web.chat.4", 4, "marked", 9.0),  # another goal's
    ]
    line = by_measure(goals.evaluate(rows))["p99 of the webhook"]
    assert line["value"] == "1.70 (worst: 16 connections, marked statistics)"
    assert line["met"] == "no"
    rows[1]["p99_ratio"] = 1.5
    assert by_measure(goals.evaluate(rows))["p99 of the webhook"]["met"] == "yes"


def limits_row(key, status, ms, disk=0, stored=None, met="no"):
    production = {"status": status, "ms": ms, "disk_bytes": disk}
    if stored is not None:
        production = {"status": status, "ms": ms, "stored": stored}
    return {"measure": f"oversize: {key}", "key": key, "production": production, "met": met}


def test_the_limits_goals_need_every_case_met_and_show_the_production_webs_answer():
    rows = [
        limits_row("limits.declared.50-mib", 413, 3, met="yes"),
        limits_row("limits.declared.20-digits", None, None),
        limits_row("limits.half-closed", 202, 4, stored=True, met="yes"),
    ]
    lines = by_measure(goals.evaluate(rows))
    declared = lines["oversize declared body, none sent"]
    assert declared["met"] == "no"
    assert declared["value"] == (
        "limits.declared.50-mib: 413 in 3 ms, 0.0 MiB on disk at most;"
        " limits.declared.20-digits: no answer in 5 s, 0.0 MiB on disk at most"
    )
    assert lines["half-closed complete delivery"]["met"] == "yes"
    assert lines["oversize body declared and sent"]["met"] == goals.NOT_MEASURED


def test_every_goal_of_the_issue_is_in_the_goals_table():
    targets = {line["goal"] for line in goals.evaluate([])}
    assert {
        ">= 0.9 x raw psycopg",
        "within 10 % of by id",
        ">= 0.9 x gunicorn sync",
        ">= 0.8 x same-shape view",
        "<= 1.5 x gunicorn sync's",
        "<= 1.5 x same-shape view's",
        "p50 <= 150 ms, p99 <= 500 ms",
        "<= 50 ms at 500 streams",
        "0 (below 0.01)",
        "p99 <= 1 s at 500 streams",
        "0 statements, <= 2 % of a core at 500",
        "413 within 100 ms, nothing on disk",
        ">= 5 x procrastinate",
        ">= 1.8 x procrastinate",
    } <= targets
    # Every key a goal reads is one some measure of this suite produces.
    keys = {goal.key for goal in goals.GOALS if isinstance(goal, goals.Ratio | goals.Between)}
    keys |= {key for goal in goals.GOALS if isinstance(goal, goals.Worst) for key in goal.keys}
    produced = {"ingest.slug.1", "ingest.slug.8", "ingest.id.1", "ingest.id.8",
                "duplicate.slug", "drain.x10", "drain.x1", "drain.x10.records",
                "drain.x1.records"}  # fmt: skip
    produced |= {
        f"web.{name}.{n}" for name in ("webhook", "chat", "answer", "answer.sync") for n in (4, 16)
    }
    assert keys <= produced
    assert {goal.key for goal in goals.GOALS if isinstance(goal, goals.Judged)} == {
        "live.pages", "live.streams", "live.idle", "limits.declared", "limits.sent",
        "limits.half-closed",
    }  # fmt: skip


# --- --only ----------------------------------------------------------------------------------


def test_only_takes_known_measures_and_refuses_others_by_name(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    assert run.parse_only(parser, "ingest, chat") == ["ingest", "chat"]
    with pytest.raises(SystemExit):
        run.parse_only(parser, "ingest,nonsense")
    assert "nonsense" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.parse_only(parser, " , ")


# --- the statistics phases -------------------------------------------------------------------


def test_an_unknown_phase_or_a_marked_phase_without_a_way_to_mark_is_refused():
    with pytest.raises(ValueError, match="phase must be one of"):
        phases.prepare(None, "stale")
    with pytest.raises(ValueError, match="needs mark"):
        phases.prepare(None, "marked")


@pytest.fixture
def bench_cursor():
    """A cursor in autocommit (VACUUM refuses a transaction); autovacuum back on after."""
    from django.db import connection

    with connection.cursor() as cursor:
        yield cursor
        phases.thaw(cursor)


def mark_with_ingest(inbox_ids):
    from inbox.services import ingest

    for inbox_id in inbox_ids:
        ingest(inbox_id, "bench", "marker", {"text": "sets the marker"})


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_fresh_statistics_are_gathered_with_every_marker_null_and_autovacuum_off(
    make_inbox, bench_cursor
):
    for _ in range(30):
        make_inbox()

    described = phases.prepare(bench_cursor, "fresh")

    assert described["autovacuum_off"] is True
    assert described["inboxes"] == described["leases"] == 30
    assert described["planner_inboxes"] == described["planner_leases"] == 30
    assert described["planner_events"] == 0
    assert described["marked_leases"] == 0
    assert described["work_at_null_frac"] == 1.0
    bench_cursor.execute(
        "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
        " AND relkind = 'r' AND NOT ('autovacuum_enabled=false' = ANY(coalesce(reloptions, '{}')))"
    )
    assert bench_cursor.fetchone()[0] == 0  # every table of the schema, not just three


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_marked_statistics_are_gathered_after_every_lease_has_its_marker(make_inbox, bench_cursor):
    inboxes = [make_inbox() for _ in range(30)]
    phases.prepare(bench_cursor, "fresh")
    mark_with_ingest([inboxes[0].pk])  # one already has work: it is not marked twice

    described = phases.prepare(bench_cursor, "marked", mark=mark_with_ingest)

    assert described["marked_leases"] == described["leases"] == 30
    assert described["work_at_null_frac"] == 0.0
    assert described["planner_events"] == 30  # one marker event per inbox
    assert described["autovacuum_off"] is True
    assert "work_at null_frac 0.00" in phases.summary("marked", described)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_fresh_statistics_refuse_a_database_where_a_marker_is_already_set(make_inbox, bench_cursor):
    inbox = make_inbox()
    mark_with_ingest([inbox.pk])
    with pytest.raises(RuntimeError, match="every work_at NULL; 1 are set"):
        phases.prepare(bench_cursor, "fresh")


def test_the_drain_rows_put_records_on_against_procrastinate_and_against_records_off():
    from bench import drain

    def sample(rate, server_cpu_ms=0.5):
        return {"rate": rate, "cpu_ms": 1.0, "server_cpu_ms": server_cpu_ms, "startup": 0.5}

    shape = (200, 10)
    samples = {
        (shape, "alwayson"): [sample(900), sample(1000), sample(1100)],
        (shape, "alwayson-unrecorded"): [sample(1200), sample(1250), sample(1300)],
        (shape, "procrastinate"): [sample(90, 0.9), sample(100, 1.0), sample(110, None)],
    }
    main, records = drain._row(shape, samples, 3), drain._records_row(shape, samples, 3)
    assert (main["key"], main["alwayson"], main["reference"], main["ratio"]) == (
        "drain.x10", 1000, 100, 10.0)  # fmt: skip
    assert (records["key"], records["alwayson"], records["reference"], records["ratio"]) == (
        "drain.x10.records", 1000, 1250, 0.8)  # fmt: skip
    assert common.met(records) == "no"
    # The server's CPU per event: a median, or none when a sample could not see the server.
    assert main["alwayson_server_cpu_ms_per_event"] == 0.5
    assert main["reference_server_cpu_ms_per_event"] is None


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_drain_counts_the_server_cpu_of_its_sessions_open_and_closed(monkeypatch):
    """bench/drain.py's server CPU: each psycopg session's backend read from /proc, an open
    one when asked and a closed one as it closed (its backend is gone after)."""
    import psycopg
    from django.db import connection

    from bench import drain

    for name in ("connect", "close"):  # put back after the test: follow() patches psycopg
        monkeypatch.setattr(psycopg.Connection, name, getattr(psycopg.Connection, name))
        monkeypatch.setattr(psycopg.AsyncConnection, name, getattr(psycopg.AsyncConnection, name))
    monkeypatch.setattr(psycopg, "connect", psycopg.connect)
    sessions = drain._Sessions()
    sessions.follow()
    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    conn = psycopg.connect(autocommit=True, **{k: params[k] for k in keys if params.get(k)})
    # Work enough for the kernel's clock ticks to count it (a tenth of a second or more).
    conn.execute("SELECT count(*) FROM generate_series(1, 3000000)")
    while_open = sessions.cpu()
    conn.close()
    assert while_open > 0
    assert sessions.cpu() >= while_open  # counted as it closed, not lost with its backend
    assert conn not in sessions.open


# --- the web rows (bench/web.py, bench/load.py) --------------------------------------------------

WRK_LINE = (
    'BENCH-WRK {"requests": 2400, "duration_us": 3000000, "p50_us": 4100, "p90_us": 9000,'
    ' "p99_us": 21000, "max_us": 48000, "statuses": {"202": 2399, "500": 1}, "exhausted": 0,'
    ' "errors": {"connect": 0, "read": 2, "write": 0, "status": 1, "timeout": 0}}'
)


def test_wrks_line_gives_the_rate_percentiles_and_statuses():
    from bench import load

    result = load.parse("Running 3s test @ http://127.0.0.1:1/\n" + WRK_LINE + "\n")
    assert result.rate == pytest.approx(800.0)
    assert (result.p50_ms, result.p90_ms, result.p99_ms, result.max_ms) == (4.1, 9, 21, 48)
    assert result.statuses == {202: 2399, 500: 1}
    assert result.unexpected(202) == {"HTTP 500": 1, "socket read": 2}
    assert result.unexpected(500) == {"HTTP 202": 2399, "socket read": 2}


def test_wrk_output_without_the_line_is_refused_with_the_output():
    from bench import load

    with pytest.raises(load.WrkFailed, match="no BENCH-WRK line") as raised:
        load.parse("Running 1s test\nunable to connect to 127.0.0.1:1 Connection refused\n")
    assert "Connection refused" in str(raised.value)


def test_wrk_runs_the_script_with_its_arguments_and_at_most_a_thread_per_connection():
    from bench import load

    argv = load.command("http://127.0.0.1:9", "chat.lua", 16, 3, ("slugs", "a=b; c=d", 7))
    assert argv[1:5] == ["-t2", "-c16", "-d3s", "--timeout"]
    assert argv[argv.index("-s") + 1] == str(load.SCRIPTS / "chat.lua")
    assert argv[-5:] == ["http://127.0.0.1:9/", "--", "slugs", "a=b; c=d", "7"]
    assert load.command("http://x", "chat.lua", 1, 1)[1] == "-t1"


def result(rate, p50, p99, statuses):
    from bench import load

    return load.Result(rate * 2, 2.0, p50, p50, p99, p99, statuses)


def test_a_web_row_has_both_systems_medians_their_ratios_and_every_status():
    from bench import web

    ours = [result(300, 10, 40, {202: 600}), result(280, 11, 60, {202: 560}),
            result(320, 9, 50, {202: 640})]  # fmt: skip
    theirs = [result(400, 5, 20, {202: 800}), result(420, 6, 25, {202: 840}),
              result(380, 5, 30, {202: 760})]  # fmt: skip
    row = web.http_row("webhook", "webhook", 16, "marked", ours, theirs, 2.5, 0.9, 1.5)
    assert row["key"] == "web.webhook.16" and row["measure"] == "webhook, 16 connections"
    assert (row["alwayson"], row["reference"]) == (300, 400)
    assert row["ratio"] == pytest.approx(0.75) and common.met(row) == "no"
    assert (row["alwayson_p50_ms"], row["alwayson_p99_ms"]) == (10, 50)
    assert (row["reference_p50_ms"], row["reference_p99_ms"]) == (5, 25)
    assert row["p99_ratio"] == pytest.approx(2.0) and web.p99_met(row) == "no"
    assert row["statuses"] == {"alwayson": {"202": 1800}, "reference": {"202": 2400}}
    assert row["runs"] == {"alwayson": [300, 280, 320], "reference": [400, 420, 380]}
    out = io.StringIO()
    web.print_latencies([row], out)
    cells = [cell.strip() for cell in out.getvalue().splitlines()[2].split("|")]
    assert cells == ["webhook, 16 connections", "marked", "10.0 / 50.0 ms", "5.0 / 25.0 ms",
                     "2.00", "<= 1.5", "no", "1800 x 202; 2400 x 202"]  # fmt: skip


def test_a_web_row_has_each_systems_cpu_per_request_and_what_production_costs_beyond():
    import dataclasses

    from bench import web

    def costing(web_ms, db_ms):
        return dataclasses.replace(result(300, 10, 40, {302: 600}), web_cpu_ms=web_ms,
                                   db_cpu_ms=db_ms)  # fmt: skip

    ours = [costing(2.5, 0.9), costing(2.4, 0.8), costing(3.1, 1.0)]
    theirs = [costing(2.0, 0.5), costing(2.2, 0.6), costing(2.1, 0.55)]
    row = web.http_row("answer", "answer", 4, "marked", ours, theirs, 2.5, 0.8, 1.5)
    assert (row["alwayson_web_cpu_ms"], row["alwayson_db_cpu_ms"]) == (2.5, 0.9)
    assert (row["reference_web_cpu_ms"], row["reference_db_cpu_ms"]) == (2.1, 0.55)
    out = io.StringIO()
    web.print_cpu([row], out)
    cells = [cell.strip() for cell in out.getvalue().splitlines()[2].split("|")]
    assert cells == ["answer, 4 connections", "marked", "2.50 / 0.90 ms", "2.10 / 0.55 ms",
                     "+0.75 ms"]  # fmt: skip
    # A run whose database was out of sight: no median, no difference, the web's still shown.
    theirs[1] = dataclasses.replace(theirs[1], db_cpu_ms=None)
    row = web.http_row("answer", "answer", 4, "marked", ours, theirs, 2.5, 0.8, 1.5)
    assert row["reference_db_cpu_ms"] is None
    assert web.cpu_cells(row)[3:] == ["2.10 / - ms", "-"]
    # Rows without figures (older JSON) print nothing.
    assert web.cpu_cells(entry("x", "marked", 1, 2)) is None


def test_a_processs_cpu_is_read_from_proc_and_none_once_it_is_gone():
    import os

    spent = common.cpu_seconds(os.getpid())
    sum(range(3_000_000))  # enough for the kernel's clock ticks to count it
    assert common.cpu_seconds(os.getpid()) > spent >= 0
    assert common.cpu_seconds(2**22 + 1) is None  # above Linux's largest pid


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_database_cpu_of_a_web_run_counts_the_sessions_of_its_database_but_its_own():
    import psycopg
    from django.db import connection

    from bench import web

    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    conninfo = {k: params[k] for k in keys if params.get(k)}
    database = web.DatabaseCpu(psycopg.conninfo.make_conninfo(**conninfo))
    other = psycopg.connect(autocommit=True, **conninfo)
    try:
        before = database.snapshot()
        assert other.info.backend_pid in before
        assert database.conn.info.backend_pid not in before
        # Its own reading does not count; another session's work does.
        database.conn.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        assert database.since(before) < 0.05
        other.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        assert database.since(before) > 0.05
    finally:
        other.close()
        database.close()


def test_the_systems_of_a_row_run_in_an_order_rotated_and_reversed_each_round():
    from bench import web

    calls = []

    def system(name):
        def run(seconds, connections):
            calls.append((name, seconds, connections))
            return name

        return run

    found = web.interleaved({n: system(n) for n in "abc"}, 3, 5, 16)
    assert [name for name, _, _ in calls] == list("abcacbcab")
    assert {(seconds, connections) for _, seconds, connections in calls} == {(5, 16)}
    assert found["results"] == {"a": ["a"] * 3, "b": ["b"] * 3, "c": ["c"] * 3}


# --- the live rows' stream client (bench/live.py) -----------------------------------------------


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def test_chunked_bytes_are_decoded_however_the_reads_split_them():
    from bench.live import Dechunk

    body = chunked(b"retry: 1000\n\n", b"id: 7.1.0\ndata: <p>hi</p>\n\n", b"x" * 300)
    for size in (1, 2, 5, 64, len(body)):
        decoder = Dechunk()
        out = b"".join(decoder.feed(body[i : i + size]) for i in range(0, len(body), size))
        assert out == b"retry: 1000\n\nid: 7.1.0\ndata: <p>hi</p>\n\n" + b"x" * 300


def test_a_stream_counts_its_pushes_and_keeps_when_it_first_had_each_reply():
    import re

    from bench.live import Stream

    stream = Stream(re.compile(rb"bench-reply-s-(\d+)-end"), chunked=False)
    stream.take(b"retry: 1000\n\n", 0.0)
    stream.take(b"id: 1.1.1\ndata: <p>working</p>\n\n: heartbeat\n\n", 1.0)
    stream.take(b"id: 2.1.0\ndata: <p>bench-reply-s-", 2.0)  # the marker split by the read
    stream.take(b"12-end</p>\n\nid: 3.1.0\ndata: <p>bench-reply-s-12-end bench-reply-s-1", 3.0)
    stream.take(b"3-end</p>\n\n", 4.0)
    assert stream.pushes == 3
    assert stream.seen == {12: 3.0, 13: 4.0}
