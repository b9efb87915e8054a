"""The deployment files in deploy/ run the commands of alwayson/ops/processes.py, and only those.

Docker cannot run here, so the Dockerfile and the compose file are read and checked; the
systemd units are checked by `systemd-analyze verify` too. tests/processes/test_production_pg.py
starts the same commands (through `runall --production`) and drives an event through them.
"""

import importlib
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

from alwayson.ops.processes import PROCESSES, RELEASE, local_argv
from tests.support.deploy import DEPLOY, UNITS, normalized, unit_values
from tests.support.env import check_deploy, environment, strong_key
from tests.support.paths import ROOT as BASE_DIR

# The paths the units install to; see docs/how-to/production.md.
UNIT_VENV, UNIT_APP, UNIT_ENV = "/opt/alwayson/venv/bin/", "/opt/alwayson/app", "/etc/alwayson"


# --- compose ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_has_the_database_the_release_steps_and_the_processes(compose):
    assert set(compose["services"]) == {"db", *RELEASE.keys() - {"collectstatic"}, *PROCESSES}
    assert compose["services"]["db"]["image"].startswith("postgres:")


def test_compose_runs_the_production_commands(compose):
    services = compose["services"]
    assert {name: tuple(services[name]["command"]) for name in PROCESSES} == PROCESSES
    assert tuple(services["migrate"]["command"]) == RELEASE["migrate"]
    assert tuple(services["workerrole"]["command"]) == RELEASE["workerrole"]


def test_compose_makes_the_workers_role_after_migrate_and_before_the_worker(compose):
    """As the tables' owner (the app's DATABASE_URL), once migrate has made this release's
    tables; the worker starts only once its role reaches them."""
    services = compose["services"]
    step = services["workerrole"]
    assert step["restart"] == "no"
    assert step["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert services["worker"]["depends_on"]["workerrole"] == {
        "condition": "service_completed_successfully"
    }


def test_compose_migrates_once_before_the_processes_and_after_the_database(compose):
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert "healthcheck" in services["db"]
    for name in PROCESSES:
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
        assert services[name]["restart"] == "unless-stopped"
        assert services[name]["env_file"] == "alwayson.env"
        url = services[name]["environment"]["DATABASE_URL"]
        assert url.startswith("postgres://") and url.endswith("@db:5432/alwayson")


def test_compose_seals_the_worker_and_shares_the_socket_with_egress_alone(compose):
    """The worker holds no credential and calls through egress's socket: every process is
    told where it is (so those that hold credentials hide themselves), and only the worker
    and egress mount its volume."""
    services = compose["services"]
    socket = services["worker"]["environment"]["ALWAYSON_EGRESS_SOCKET"]
    assert socket == template()["ALWAYSON_EGRESS_SOCKET"]
    directory = str(Path(socket).parent)
    for name in PROCESSES:
        assert services[name]["environment"]["ALWAYSON_EGRESS_SOCKET"] == socket
    mounting = {
        name
        for name, service in services.items()
        if any(volume.endswith(f":{directory}") for volume in service.get("volumes", []))
    }
    assert mounting == {"egress", "worker"}
    assert services["worker"]["depends_on"]["egress"] == {"condition": "service_started"}
    # The image makes the directory, so the fresh volume is its user's, not root's.
    runs = " ".join(args for instruction, args in dockerfile_instructions() if instruction == "RUN")
    assert f"install -d -m 750 -o alwayson -g alwayson {directory}" in runs


def test_compose_checks_the_web_process_through_healthz(compose):
    web = compose["services"]["web"]
    assert "/healthz" in " ".join(web["healthcheck"]["test"])
    assert web["environment"]["ALWAYSON_WEB_BIND"] == "0.0.0.0:8000"
    assert web["ports"] == ["8000:8000"]


# Where the docs and the deploy files' comments write compose commands for a person to run.
COMMAND_SOURCES = ("README.md", "docs/**/*.md", "deploy/**/*")


def compose_commands():
    """(file, argv) of every `docker compose ...` written in the docs and deploy/: to the end
    of its inline code span, or of its line."""
    found = []
    for pattern in COMMAND_SOURCES:
        for path in sorted(p for p in BASE_DIR.glob(pattern) if p.is_file()):
            for line in path.read_text().splitlines():
                for match in re.finditer(r"docker compose [^`\n]*", line):
                    argv = shlex.split(match.group(0))
                    found.append(pytest.param(path, argv, id=f"{path.name}:{argv[-1]}"))
    return found


def test_the_docs_write_compose_commands():
    # Guards the test below against finding nothing: the up, status and prune commands.
    assert {param.values[1][-1] for param in compose_commands()} >= {"-d", "status", "prune"}


def option(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize(("path", "argv"), compose_commands())
def test_each_compose_command_in_the_docs_works_as_written(path, argv, compose):
    """Every subcommand, `exec` and `run` too, interpolates the compose file, which needs
    POSTGRES_PASSWORD from the environment file: without `--env-file` it fails."""
    assert Path(option(argv, "--env-file") or "").name == "alwayson.env", argv
    assert (option(argv, "-f") or "").endswith("deploy/compose.yaml"), argv
    subcommand = argv[argv.index("-f") + 2 :]
    if subcommand[0] in ("exec", "run"):
        service, *command = [word for word in subcommand[1:] if not word.startswith("-")]
        assert service in compose["services"], argv
        if command[:2] == ["python", "manage.py"]:
            assert command[2] in get_commands(), argv


def interpolate(text, variables):
    """Compose's interpolation of `${NAME}`, `${NAME:-default}` and `${NAME:?error}`: the
    error raised as ValueError, as compose refuses to run."""

    def value(match):
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        given = variables.get(name, "")
        if operator == ":?" and not given:
            raise ValueError(f"{name}: {argument}")
        return given or (argument if operator == ":-" else "")

    return re.sub(r"\$\{(\w+)(?:(:[?-])([^}]*))?\}", value, text)


def test_compose_interpolates_only_what_the_env_template_sets():
    names = set(re.findall(r"\$\{(\w+)", (DEPLOY / "compose.yaml").read_text()))
    assert names, "the compose file interpolates POSTGRES_PASSWORD"
    assert {name for name in names if template().get(name)} == names


def test_compose_with_the_env_file_gets_the_database_password():
    values = template()
    text = interpolate((DEPLOY / "compose.yaml").read_text(), values)
    services = yaml.safe_load(text)["services"]
    password = values["POSTGRES_PASSWORD"]
    worker_password = values["POSTGRES_WORKER_PASSWORD"]

    assert services["db"]["environment"]["POSTGRES_PASSWORD"] == password
    assert worker_password != password
    for name in [*PROCESSES, "workerrole"]:
        environment = services[name]["environment"]
        assert environment["DATABASE_URL"] == f"postgres://alwayson:{password}@db:5432/alwayson"
        # The sealed worker swaps this one in; the workerrole step makes its role.
        assert environment["ALWAYSON_WORKER_DATABASE_URL"] == (
            f"postgres://alwayson_worker:{worker_password}@db:5432/alwayson"
        )


def test_compose_without_the_env_file_says_to_pass_it():
    with pytest.raises(ValueError) as refused:
        interpolate((DEPLOY / "compose.yaml").read_text(), {})
    assert "--env-file deploy/alwayson.env" in str(refused.value)


# --- Dockerfile ------------------------------------------------------------------------------


def dockerfile_instructions():
    """(instruction, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_the_dockerfile_builds_in_stages_and_runs_as_a_user_without_privileges():
    instructions = dockerfile_instructions()
    stages = [args for op, args in instructions if op == "FROM"]
    assert len(stages) >= 2, stages
    runtime = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    assert any(op == "COPY" and args.startswith("--from=") for op, args in runtime)
    [user] = [args for op, args in runtime if op == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    # The user is the last thing set before the command: nothing after it runs as root.
    assert [op for op, _ in runtime][-3:] == ["USER", "EXPOSE", "CMD"]


def test_the_dockerfile_runs_the_web_command_and_collects_static_files_at_build():
    instructions = dockerfile_instructions()
    [cmd] = [args for op, args in instructions if op == "CMD"]
    assert tuple(yaml.safe_load(cmd)) == PROCESSES["web"]  # the JSON form
    runs = [shlex.split(args) for op, args in instructions if op == "RUN"]
    collect = [
        run[next(i for i, word in enumerate(run) if "=" not in word) :]
        for run in runs
        if "collectstatic" in run
    ]
    assert [tuple(command) for command in collect] == [RELEASE["collectstatic"]]


def test_the_image_installs_the_locked_dependencies_then_alwayson_without_them():
    """requirements/base.txt, hashes required, before the code is copied (a layer of its
    own); then alwayson, built with the lock's build backend and no dependency of its own."""
    instructions = dockerfile_instructions()
    build = instructions[: max(i for i, (op, _) in enumerate(instructions) if op == "FROM")]
    steps = [(op, args) for op, args in build if op in ("COPY", "RUN")]
    pips = [(i, shlex.split(args)) for i, (op, args) in enumerate(steps) if "pip" in args]
    assert [argv for _, argv in pips] == [
        ["pip", "install", "--require-hashes", "-r", "requirements/base.txt"],
        ["pip", "install", "--no-deps", "--no-build-isolation", "."],
    ]
    first_code = next(i for i, (op, args) in enumerate(steps) if args.startswith("alwayson "))
    assert pips[0][0] < first_code < pips[1][0]
    assert ("COPY", "requirements/base.txt requirements/base.txt") in steps


def test_the_image_holds_every_package_the_project_ships():
    project = tomllib.loads((BASE_DIR / "pyproject.toml").read_text())
    packages = {
        name.rstrip("*") for name in project["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    instructions = dockerfile_instructions()
    runtime = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    copied = {
        word.rstrip("/")
        for op, args in runtime
        if op == "COPY" and not args.startswith("--from=")
        for word in args.split()[:-1]
    }
    assert packages | {"manage.py", "templates"} <= copied


# --- systemd ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROCESSES)
def test_each_unit_runs_its_production_command(name):
    unit = UNITS / f"alwayson-{name}.service"

    [exec_start] = unit_values(unit, "ExecStart")

    assert normalized(shlex.split(exec_start)) == PROCESSES[name]
    assert unit_values(unit, "User") == ["alwayson"]
    assert unit_values(unit, "WorkingDirectory") == [UNIT_APP]
    assert unit_values(unit, "Requires") == ["alwayson-migrate.service"]
    assert unit_values(unit, "WantedBy") == ["alwayson.target"]


def test_the_release_unit_runs_the_release_steps_in_order():
    release = UNITS / "alwayson-migrate.service"
    steps = [normalized(shlex.split(command)) for command in unit_values(release, "ExecStart")]
    assert steps == list(RELEASE.values())
    assert unit_values(release, "Type") == ["oneshot"]


@pytest.mark.parametrize("name", PROCESSES)
def test_a_process_unit_writes_nothing_before_it_starts(name):
    """collectstatic at the web unit's start needed a checkout its user could write, and
    restarted the unit in a loop when it could not: it is a release step, run once."""
    unit = UNITS / f"alwayson-{name}.service"
    assert unit_values(unit, "ExecStartPre") == []


def test_systemd_seals_the_worker_behind_the_egress_unit():
    socket = Path(template()["ALWAYSON_EGRESS_SOCKET"])
    egress = UNITS / "alwayson-egress.service"
    assert unit_values(egress, "RuntimeDirectory") == [socket.parent.name]
    assert str(socket.parent) == f"/run/{socket.parent.name}"
    assert unit_values(egress, "RuntimeDirectoryMode") == ["0750"]
    worker = UNITS / "alwayson-worker.service"
    assert "alwayson-egress.service" in unit_values(worker, "Wants")[0].split()
    assert "alwayson-egress.service" in unit_values(worker, "After")[0].split()


def test_the_target_starts_the_processes():
    [wants] = unit_values(UNITS / "alwayson.target", "Wants")
    assert sorted(wants.split()) == sorted(f"alwayson-{name}.service" for name in PROCESSES)


def test_systemd_accepts_the_units(tmp_path):
    """`systemd-analyze verify` on the units, pointed at this checkout's virtualenv (it checks
    that each command exists): any unknown key or bad value is printed, and fails this."""
    venv_bin = Path(__import__("sys").executable).parent
    for unit in UNITS.iterdir():
        text = (
            unit.read_text()
            .replace(UNIT_VENV, f"{venv_bin}/")
            .replace(UNIT_APP, str(BASE_DIR))
            .replace(f"{UNIT_ENV}/alwayson.env", str(DEPLOY / "alwayson.env.example"))
        )
        (tmp_path / unit.name).write_text(text)

    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert (done.returncode, done.stdout + done.stderr) == (0, "")


# --- the environment file --------------------------------------------------------------------


def template():
    pairs = [
        line.split("=", 1)
        for line in (DEPLOY / "alwayson.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    return dict(pairs)


def test_the_env_template_sets_only_variables_something_reads():
    readers = "\n".join(
        path.read_text()
        for path in (
            *(BASE_DIR / "alwayson/settings").glob("*.py"),
            BASE_DIR / "alwayson/gunicorn_conf.py",
            DEPLOY / "compose.yaml",
        )
    )
    unread = [
        name for name in template() if f'"{name}"' not in readers and f"${{{name}" not in readers
    ]
    assert unread == []


def test_the_env_template_reads_the_same_in_a_shell():
    """The production how-to runs createsuperuser with the units' environment by sourcing the
    file in sh (`set -a; . /etc/alwayson/alwayson.env`): sh must read what systemd reads."""
    done = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; env -0', "sh", str(DEPLOY / "alwayson.env.example")],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    read = dict(item.split("=", 1) for item in done.stdout.split("\0") if item)
    assert {name: read.get(name) for name in template()} == template()


def test_the_env_template_filled_with_a_key_passes_check_deploy():
    values = template()
    assert values["SECRET_KEY"] == ""  # start-up refuses until it is filled in
    values["SECRET_KEY"] = strong_key()

    code, output = check_deploy(environment(**values))

    assert code == 0, output  # nothing reported, at any level


# --- gunicorn's settings ---------------------------------------------------------------------


def test_gunicorn_reads_where_to_listen_how_many_workers_and_their_threads(monkeypatch):
    from alwayson import gunicorn_conf

    monkeypatch.setenv("ALWAYSON_WEB_BIND", "0.0.0.0:8000")
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    monkeypatch.setenv("WEB_THREADS", "6")
    importlib.reload(gunicorn_conf)

    assert (gunicorn_conf.bind, gunicorn_conf.workers, gunicorn_conf.threads) == (
        ["0.0.0.0:8000"],
        3,
        6,
    )


@pytest.mark.parametrize("name", ["WEB_CONCURRENCY", "WEB_THREADS", "ALWAYSON_WEB_ACCEPT_HOLD_MS"])
@pytest.mark.parametrize("value", ["0", "-1", "two", ""])
def test_a_malformed_worker_or_thread_count_stops_gunicorn(monkeypatch, name, value):
    from alwayson import gunicorn_conf

    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=f"{name} must be a positive integer"):
        importlib.reload(gunicorn_conf)


def gunicorn_settings():
    """The settings gunicorn resolves from the web command's config (`--print-config`)."""
    command = [*local_argv(PROCESSES["web"], BASE_DIR)]
    done = subprocess.run(
        [*command[:-1], "--print-config", command[-1]],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pairs = (line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return {name.strip(): value.strip() for name, value in pairs}


def test_gunicorn_runs_the_web_worker_on_django_wsgi_application():
    """The web command names no worker class: the config does (alwayson/web/serving.py)."""
    settings = gunicorn_settings()
    assert settings["worker_class"] == "alwayson.web.serving.Worker"
    assert settings["threads"] == "4"
    assert PROCESSES["web"][-1] == "alwayson.wsgi"


def test_gunicorn_opens_no_control_socket():
    """gunicorn (25.1 on) opens a control socket for gunicornc under $XDG_RUNTIME_DIR or
    ~/.gunicorn; the units' and the image's user has no home, so every start logged "Control
    server error". The process manager starts and stops gunicorn: the socket is off."""
    assert gunicorn_settings()["control_socket_disable"] == "True"
