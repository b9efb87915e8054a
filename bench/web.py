"""The web rows, measured as users meet the web tier: wrk (bench/load.py, bench/wrk/*.lua)
against the production web and, in the same run, against gunicorn's sync workers serving the
same code (bench/servers.py), both started here on the bench database, at 4 and 16
connections, interleaved, medians of the runs:

- webhook: the GitHub webhook by slug, signed (one body, its HMAC-SHA256 computed once), a
  new delivery per request (202); production against the sync reference.
- chat: the chat form post of a person logged in once through the login form (session and
  CSRF cookies, the form's token), a new message_id per request (302); production against
  the sync reference.
- answer: an approval's "yes" from that person (302), each request answering one waiting
  approval (bench/waiting.py makes enough before each run); production against the
  same-shape view on the same production web (bench/urls.py: the same login, CSRF check and
  form, one INSERT), and, as a row of its own, against the sync reference serving the same
  product view.

Each row gives both rates, their ratio, both p50 and p99, the p99 ratio and the statuses; a
run with any status but the expected one (or a socket error) fails, naming the server's log.
Each also gives the CPU one request cost each system over the runs (medians): the server's
processes (master and workers, every thread) and the database's sessions, read from /proc;
what a ratio below its goal is made of.
bench/limits.py adds the oversize and half-close rows against the same two servers.
"""

import dataclasses
import hashlib
import hmac
import itertools
import json
import re
import tempfile
import urllib.error
import urllib.request
from contextlib import closing
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

from . import common, load, servers

GITHUB_SECRET = common.BENCH_ENV["ALWAYSON_GITHUB_SECRETS"]
USERNAME, PASSWORD = "bench", "bench-password-0123"
CONNECTIONS = (4, 16)
INBOXES = 100
P99_GOAL = 1.5  # each p99 at most this many times its reference's
_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
_RUNS = itertools.count(1)
BODY = json.dumps({"action": "opened", "issue": {"number": 1, "title": "a bug"}}).encode()


def sizes(quick) -> dict:
    """Seconds per timed wrk run, per warm-up run, timed runs per system (medians of these),
    and the statistics phases measured (quick: the last only, "marked")."""
    if quick:
        return {"seconds": 3, "warm": 3, "runs": 2, "phases": ("marked",)}
    return {"seconds": 5, "warm": 2, "runs": 3, "phases": ("fresh", "marked")}


def setup(quick, repeats, phases) -> dict:
    """The person (the owner of every inbox, so an approver), the inboxes, and one template
    approval per inbox for bench/waiting.py's copies."""
    from django.contrib.auth import get_user_model

    from bench.ingest import make_inboxes
    from bench.waiting import Waiting

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_password(PASSWORD)
    user.save()
    slugs = [inbox.slug for inbox in make_inboxes(INBOXES, "web")]
    return {"slugs": slugs, "waiting": Waiting(slugs)}


class Session:
    """A browser's cookies (kept whatever their Secure flag: the bench speaks plain HTTP on
    the loopback) and the CSRF token of the last form it read."""

    def __init__(self, base):
        self.base = base
        self.cookies = {}
        self.token = None
        self.opener = urllib.request.build_opener(_NoRedirect)

    def fetch(self, path, form=None) -> tuple[int, str]:
        data = urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers())
        try:
            response = self.opener.open(request, timeout=30)
        except urllib.error.HTTPError as exc:
            response = exc
        for header in response.headers.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(header).items():
                self.cookies[name] = morsel.value
        text = response.read().decode(errors="replace")
        if found := _TOKEN.search(text):
            self.token = found.group(1)
        return response.status if hasattr(response, "status") else response.code, text

    def headers(self) -> dict:
        return {"Cookie": self.cookie()} if self.cookies else {}

    def cookie(self) -> str:
        return "; ".join(f"{name}={value}" for name, value in self.cookies.items())

    def log_in(self, username, password, then):
        self.fetch("/accounts/login/")
        status, text = self.fetch(
            "/accounts/login/",
            {"csrfmiddlewaretoken": self.token, "username": username, "password": password},
        )
        if status != 302:
            raise RuntimeError(f"logging in answered {status}, not a redirect: {text[:300]}")
        # Logging in rotates the CSRF token: read the one the form carries now.
        status, _ = self.fetch(then)
        if status != 200:
            raise RuntimeError(f"{then} answered {status} after logging in")
        return self


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def signature(body, secret=GITHUB_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class DatabaseCpu:
    """The CPU of the database's sessions on the bench database (/proc/<pid>/stat), but the
    one this reads them through: under a run, the sessions of the server under load (the
    other server's sit idle). A session that closes during a run takes its CPU with it;
    both servers keep theirs open (CONN_MAX_AGE, bench/settings.py). None throughout when
    the database's processes are out of this machine's sight."""

    def __init__(self, url):
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def snapshot(self) -> dict[int, float] | None:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        found = {pid: common.cpu_seconds(pid) for (pid,) in rows}
        seen = {pid: seconds for pid, seconds in found.items() if seconds is not None}
        return seen if seen or not found else None

    def since(self, before) -> float | None:
        """Seconds of CPU since `before` (a snapshot); a session opened since counts whole."""
        after = self.snapshot()
        if before is None or after is None:
            return None
        return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())

    def close(self):
        self.conn.close()


class Rows:
    """The rows' runs against two started servers: each `system` is a callable taking the
    seconds to run and returning a load.Result, checked against the expected status."""

    def __init__(self, prepared, production, reference, session, phase, workdir, database=None):
        self.slugs = prepared["slugs"]
        self.waiting = prepared["waiting"]
        self.servers = {"production": production, "reference": reference}
        self.session = session
        self.phase = phase
        self.workdir = Path(workdir)
        self.slugs_file = self.workdir / "slugs"
        self.slugs_file.write_text("\n".join(self.slugs) + "\n")
        self.body_file = self.workdir / "body.json"
        self.body_file.write_bytes(BODY)
        # Numbers every run of this process (all phases): each run's ids are new, so a chat
        # message or a delivery is never a duplicate (which the product also answers 302/200).
        self.tags = _RUNS
        # Answers per second seen so far, per system: how many approvals the next run needs.
        self.seen_rate = {}
        self.warming = False
        self.database = database

    def timed(self, server, *args) -> load.Result:
        """load.run(server.base, *args), with the CPU each request cost the server's
        processes and the database's sessions over the run."""
        web = server.cpu_seconds()
        database = self.database.snapshot() if self.database else None
        result = load.run(server.base, *args)
        web = server.cpu_seconds() - web
        database = self.database.since(database) if self.database else None
        if not result.requests:
            return result
        return dataclasses.replace(
            result,
            web_cpu_ms=1000 * web / result.requests,
            db_cpu_ms=None if database is None else 1000 * database / result.requests,
        )

    def _checked(self, result, expected, server, what) -> load.Result:
        unexpected = result.unexpected(expected)
        # A warm-up on a loaded machine may end before a cold server's first answer: it is
        # untimed, so only a wrong answer fails it.
        if unexpected or (not result.requests and not self.warming):
            raise RuntimeError(
                f"{what} on the {server.name} web: {unexpected or 'no requests'} besides"
                f" {result.statuses.get(expected, 0)} x {expected}; its log: {server.log}"
            )
        return result

    def webhook(self, server_name):
        server = self.servers[server_name]

        def run(seconds, connections):
            tag = f"{self.phase}-{server_name}-{next(self.tags)}"
            args = (self.slugs_file, self.body_file, signature(BODY), tag)
            result = self.timed(server, "webhook.lua", connections, seconds, args)
            return self._checked(result, 202, server, "webhook")

        return run

    def chat(self, server_name):
        server = self.servers[server_name]

        def run(seconds, connections):
            number = next(self.tags)
            args = (self.slugs_file, self.session.cookie(), self.session.token, number)
            result = self.timed(server, "chat.lua", connections, seconds, args)
            return self._checked(result, 302, server, "chat form post")

        return run

    def answer(self, server_name, view="product"):
        """The product's answer on `server_name`, or ("reference") the same-shape view."""
        server = self.servers[server_name]
        system = f"{server_name}-{view}"

        def run(seconds, connections):
            # A run that answered every approval made for it ran out (answer.lua's 404s):
            # its rate is wrong, so it is run again with more, at most twice.
            for _ in range(3):
                tag = f"{self.phase}-{system}-{next(self.tags)}"
                if view == "product":
                    prefix, ids = "/approvals/", self._approvals(system, tag, seconds)
                else:
                    prefix, ids = "/bench/answer/", "-"
                args = (self.slugs_file, self.session.cookie(), self.session.token, prefix)
                result = self.timed(server, "answer.lua", connections, seconds, (*args, ids, tag))
                ran_out = result.exhausted
                self.seen_rate[system] = max(
                    self.seen_rate.get(system, 0), result.rate * (2 if ran_out else 1)
                )
                if not ran_out or view != "product":
                    break
            return self._checked(result, 302, server, f"answer ({view} view)")

        return run

    def _approvals(self, system, tag, seconds) -> str:
        """Waiting approvals for each wrk thread of one run (twice what the fastest run of
        this system so far answered in as long, and at least 500 a thread), written to
        <prefix>.<thread>: the ids prefix answer.lua reads."""
        rate = self.seen_rate.get(system, 400)
        per_thread = max(500, int(2 * rate * seconds / load.THREADS))
        prefix = self.workdir / f"ids-{tag}"
        requests = []
        for thread in range(1, load.THREADS + 1):
            lines = []
            for n in range(per_thread):
                slug = self.slugs[(n + thread) % len(self.slugs)]
                request_id = f"{tag}-{thread}-{n}"
                requests.append((slug, request_id))
                lines.append(f"{slug} {request_id}")
            Path(f"{prefix}.{thread}").write_text("\n".join(lines) + "\n")
        self.waiting.make(requests)
        self.waiting.check_copy(*requests[-1])
        return str(prefix)


def interleaved(systems: dict, runs: int, seconds, connections) -> dict:
    """Every system run `runs` times, the order rotated and reversed from round to round:
    each system's results, and the load average seen around them."""
    names = list(systems)
    results = {name: [] for name in names}
    loads = [common.load()]
    for n in range(runs):
        order = names[n % len(names) :] + names[: n % len(names)]
        for name in order if n % 2 == 0 else reversed(order):
            results[name].append(systems[name](seconds, connections))
            loads.append(common.load())
    return {"results": results, "load": common.median(loads)}


def http_row(name, title, connections, phase, ours, theirs, load_average, goal, p99_goal):
    """One row: the medians of both systems' runs (rate, p50, p99), their ratios, statuses."""

    def medians(results):
        def median(name):
            found = [getattr(result, name) for result in results]
            return None if None in found else common.median(found)

        return {
            "rate": common.median([result.rate for result in results]),
            "p50_ms": common.median([result.p50_ms for result in results]),
            "p99_ms": common.median([result.p99_ms for result in results]),
            "web_cpu_ms": median("web_cpu_ms"),
            "db_cpu_ms": median("db_cpu_ms"),
        }

    def statuses(results):
        total = {}
        for result in results:
            for status, count in result.statuses.items():
                total[str(status)] = total.get(str(status), 0) + count
        return total

    a, r = medians(ours), medians(theirs)
    p99_ratio = a["p99_ms"] / r["p99_ms"] if a["p99_ms"] and r["p99_ms"] else None
    return common.row(
        f"{title}, {connections} connections",
        a["rate"],
        r["rate"],
        "requests/s",
        goal,
        key=f"web.{name}.{connections}",
        phase=phase,
        clients=servers.WORKERS,
        connections=connections,
        load=load_average,
        runs={"alwayson": [x.rate for x in ours], "reference": [x.rate for x in theirs]},
        alwayson_p50_ms=a["p50_ms"],
        alwayson_p99_ms=a["p99_ms"],
        reference_p50_ms=r["p50_ms"],
        reference_p99_ms=r["p99_ms"],
        alwayson_web_cpu_ms=a["web_cpu_ms"],
        alwayson_db_cpu_ms=a["db_cpu_ms"],
        reference_web_cpu_ms=r["web_cpu_ms"],
        reference_db_cpu_ms=r["db_cpu_ms"],
        p99_ratio=p99_ratio,
        p99_goal=p99_goal,
        statuses={"alwayson": statuses(ours), "reference": statuses(theirs)},
    )


# (name, title, the systems compared: production's and the reference's, goal, p99 goal)
SHAPES = {
    "webhook": [
        (
            "webhook",
            "webhook: GitHub by slug, signed; production web / gunicorn sync",
            ("webhook", "production"),
            ("webhook", "reference"),
            0.9,
            P99_GOAL,
        )
    ],
    "chat": [
        (
            "chat",
            "chat form post: session + CSRF; production web / gunicorn sync",
            ("chat", "production"),
            ("chat", "reference"),
            0.9,
            P99_GOAL,
        )
    ],
    "answer": [
        (
            "answer",
            "approval answer post; production web / same-shape view on it",
            ("answer", "production", "product"),
            ("answer", "production", "reference"),
            0.8,
            P99_GOAL,
        ),
        (
            "answer.sync",
            "approval answer post; production web / gunicorn sync",
            ("answer", "production", "product"),
            ("answer", "reference", "product"),
            None,
            None,
        ),
    ],
}


def measure(url, quick, repeats, interleave, prepared, phase, only) -> list[dict]:
    """The rows named in `only` ("webhook", "chat", "answer", "oversize") under `phase`'s
    statistics: the two servers started for the phase (new connections, whose prepared
    statements plan under its statistics)."""
    from bench import limits

    size = sizes(quick)
    rows = []
    wanted = [name for name in SHAPES if name in only]
    oversize = "oversize" in only and phase == size["phases"][-1]
    if not (wanted and phase in size["phases"]) and not oversize:
        return rows
    production = servers.production(url).start()
    reference = servers.reference(url).start()
    try:
        session = Session(production.base).log_in(
            USERNAME, PASSWORD, f"/inbox/{prepared['slugs'][0]}/"
        )
        with (
            tempfile.TemporaryDirectory(prefix="alwayson-bench-wrk-") as workdir,
            closing(DatabaseCpu(url)) as database,
        ):
            bench = Rows(prepared, production, reference, session, phase, workdir, database)
            if phase in size["phases"]:
                for name in wanted:
                    rows += _measure_shape(bench, name, size)
        if oversize:
            rows += limits.measure(
                {"production": production, "reference": reference}, prepared["slugs"][0]
            )
    finally:
        production.stop()
        reference.stop()
    return rows


def _measure_shape(bench, name, size) -> list[dict]:
    shapes = SHAPES[name]
    systems = {}
    for _, _, ours, theirs, _, _ in shapes:
        for system in (ours, theirs):
            kind, *args = system
            systems.setdefault(system, getattr(bench, kind)(*args))
    bench.warming = True
    for run in systems.values():  # warm: code, connections, statements; untimed
        run(size["warm"], CONNECTIONS[0])
    bench.warming = False
    rows = []
    for connections in CONNECTIONS:
        found = interleaved(systems, size["runs"], size["seconds"], connections)
        for key, title, ours, theirs, goal, p99_goal in shapes:
            rows.append(
                http_row(
                    key,
                    title,
                    connections,
                    bench.phase,
                    found["results"][ours],
                    found["results"][theirs],
                    found["load"],
                    goal,
                    p99_goal,
                )
            )
    return rows


def p99_met(entry) -> str:
    ratio, goal = entry.get("p99_ratio"), entry.get("p99_goal")
    if ratio is None or goal is None:
        return "-"
    return "yes" if ratio <= goal else "no"


LATENCY_HEADER = [
    "measure",
    "stats",
    "production p50 / p99",
    "reference p50 / p99",
    "p99 ratio",
    "goal",
    "met",
    "statuses (production; reference)",
]


def latency_cells(entry) -> list[str]:
    def pair(system):
        return f"{entry[f'{system}_p50_ms']:.1f} / {entry[f'{system}_p99_ms']:.1f} ms"

    def counts(system):
        found = sorted(entry["statuses"][system].items())
        return " ".join(f"{n} x {status}" for status, n in found)

    ratio, goal = entry.get("p99_ratio"), entry.get("p99_goal")
    return [
        entry["measure"],
        entry.get("phase") or "-",
        pair("alwayson"),
        pair("reference"),
        "-" if ratio is None else f"{ratio:.2f}",
        "-" if goal is None else f"<= {goal:g}",
        p99_met(entry),
        f"{counts('alwayson')}; {counts('reference')}",
    ]


def print_latencies(rows, out=None) -> None:
    """The web rows' latencies under the same load, p99 against the reference's."""
    lines = [latency_cells(entry) for entry in rows if "p99_ratio" in entry]
    if lines:
        common.print_grid(LATENCY_HEADER, lines, out)


CPU_HEADER = [
    "measure",
    "stats",
    "production: web / database",
    "reference: web / database",
    "production - reference",
]


def cpu_cells(entry) -> list[str] | None:
    """A web row's CPU per request (ms): each system's server and database, and what the
    production web's request costs beyond the reference's in all; None without figures."""
    figures = [
        entry.get(f"{system}_{part}_cpu_ms")
        for system in ("alwayson", "reference")
        for part in ("web", "db")
    ]
    if figures[0] is None or figures[2] is None:
        return None

    def pair(web, database):
        return f"{web:.2f} / {'-' if database is None else f'{database:.2f}'} ms"

    known = None not in figures
    extra = (figures[0] + figures[1]) - (figures[2] + figures[3]) if known else None
    return [
        entry["measure"],
        entry.get("phase") or "-",
        pair(*figures[:2]),
        pair(*figures[2:]),
        "-" if extra is None else f"{extra:+.2f} ms",
    ]


def print_cpu(rows, out=None) -> None:
    """The web rows' CPU per request, each system's, under the same load."""
    lines = [cells for entry in rows if (cells := cpu_cells(entry)) is not None]
    if lines:
        common.print_grid(CPU_HEADER, lines, out)
