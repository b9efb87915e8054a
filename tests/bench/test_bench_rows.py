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


def test_a_goal_exactly_at_its_threshold_is_met():
    rows = [entry("web.chat", "fresh", 80.0, 100.0)]
    assert by_measure(goals.evaluate(rows))["chat form post through gunicorn"]["met"] == "yes"


def test_a_goal_whose_rows_did_not_run_says_so_and_is_not_met():
    lines = by_measure(goals.evaluate([]))
    assert lines["chat form post through gunicorn"]["met"] == goals.NOT_MEASURED
    assert lines["chat form post through gunicorn"]["value"] == "- (not in this run)"
    live = lines["live page: agent reply visible after its commit"]
    assert live["met"] == goals.NOT_MEASURED and live["value"] == "- (not in this run)"


# bench/live.py's rows, as it writes them.
def live_rows(p50, p99, cpu, statements):
    return [
        {"measure": "reply visible after commit, pushed", "p50_ms": p50, "p99_ms": p99, "n": 60},
        {"measure": "reply visible after commit, polled", "p50_ms": 480, "p99_ms": 1040, "n": 60},
        {
            "measure": "500 idle streams, one web process, 30 s",
            "cpu_percent": cpu,
            "web_statements_per_s": statements,
            "db_transactions_per_s": 0.0,
        },
    ]


def test_the_live_goals_read_the_pushed_latencies_and_the_idle_cost():
    lines = by_measure(goals.evaluate(live_rows(67, 124, 1.8, 0.0)))
    reply = lines["live page: agent reply visible after its commit"]
    assert (reply["value"], reply["met"]) == ("p50 67 ms, p99 124 ms", "yes")
    idle = lines["500 idle conversation pages, one web process"]
    assert (idle["value"], idle["met"]) == ("1.8 % of a core, 0.00 queries/s", "yes")


@pytest.mark.parametrize(
    "figures", [(151, 124, 1.8, 0.0), (67, 501, 1.8, 0.0), (67, 124, 10.1, 0.0), (67, 124, 1, 0.1)]
)
def test_a_live_goal_past_its_bound_is_not_met(figures):
    lines = by_measure(goals.evaluate(live_rows(*figures)))
    met = [lines[name]["met"] for name in lines if "live page" in name or "idle" in name]
    assert "no" in met


def test_every_goal_of_the_issue_is_in_the_goals_table():
    targets = {line["goal"] for line in goals.evaluate([])}
    assert {
        ">= 0.9 x raw psycopg",
        "within 10 % of by id",
        ">= 0.8 x same-shape view",
        "p50 <= 150 ms, p99 <= 500 ms",
        "<= 10 % of a core, 0 queries/s",
        ">= 5 x procrastinate",
        ">= 1.8 x procrastinate",
    } <= targets
    # Every Ratio goal names a row key some measure of this suite produces.
    keys = {goal.key for goal in goals.GOALS if isinstance(goal, goals.Ratio | goals.Between)}
    produced = {"ingest.slug.1", "ingest.slug.8", "ingest.id.1", "ingest.id.8",
                "duplicate.slug", "web.webhook", "web.chat", "web.answer", "drain.x10",
                "drain.x1", "drain.x10.records", "drain.x1.records"}  # fmt: skip
    assert keys <= produced


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
