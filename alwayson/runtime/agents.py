"""Which agent runs an inbox: a dotted path, loaded once per process."""

import logging

from django.conf import settings
from django.db import DatabaseError

from inbox import backends

from . import versions
from .loading import load_agent
from .models import AgentConfig

log = logging.getLogger("alwayson.worker")


class Agents:
    """Which agent runs an inbox: its AgentConfig's, or the default (ALWAYSON_AGENT, or the
    one a Worker was given). Loaded once per dotted path."""

    def __init__(self, default=None):
        self._default_given = default is not None
        self.default = default or load_agent()
        self._loaded = {}
        self._codes = {}

    def for_inbox(self, inbox, extras=None):
        """The inbox's agent: from `extras` (a Claim's, which read it with the take), or
        read now."""
        return self.with_version(inbox, extras)[0]

    def with_version(self, inbox, extras=None) -> tuple:
        """The inbox's agent and the version its run is stamped with (versions.py): its
        dotted path, its code's fingerprint, and the configuration revision read with it."""
        if extras is not None and "agent" in extras and "config_revision" in extras:
            row = (extras["agent"], extras["config_revision"])
        else:
            # Read on every run, so an edit in the admin applies from the next run, in every
            # worker process; by its primary key, in plain SQL: the ORM would cost more CPU
            # than the lookup itself on a run that does nothing else.
            with backends.current().cursor() as cursor:
                cursor.execute(
                    f"SELECT agent, revision FROM {AgentConfig._meta.db_table} WHERE inbox_id = %s",
                    [inbox.pk],
                )
                row = cursor.fetchone()
        path, revision = row if row else (None, None)
        if not path:
            agent = self.default
            path = self.default_path
        else:
            if path not in self._loaded:
                self._loaded[path] = load_agent(path, field=f"agent of inbox {inbox.slug}")
            agent = self._loaded[path]
        # The fingerprint once per path and process: the code does not change under a worker.
        if path not in self._codes:
            self._codes[path] = versions.fingerprint(agent)
        return agent, {
            versions.AGENT: path,
            versions.CODE: self._codes[path],
            versions.CONFIG: revision or None,
        }

    @property
    def default_path(self) -> str:
        named = settings.ALWAYSON_AGENT
        if self._default_given or not named:
            return versions.dotted_path(self.default)
        return named

    def in_use(self) -> list:
        """The default agent and every agent an inbox names, each once."""
        paths = AgentConfig.objects.exclude(agent="").values_list("agent", flat=True).distinct()
        agents = [self.default]
        for path in sorted(paths):
            agent = self._loaded.get(path) or load_agent(path, field=f"an inbox's agent {path}")
            self._loaded[path] = agent
            if agent not in agents:
                agents.append(agent)
        return agents

    def preflight(self):
        """Each agent in use may check its configuration once, at worker start-up, through a
        `preflight()` attribute (the Claude agent checks its API key there); its error stops
        the worker with that message instead of failing every run.

        A worker starting during a database outage checks the default agent only, and waits
        for the database like any loop, instead of exiting."""
        try:
            agents = self.in_use()
        except DatabaseError:
            log.warning("database unavailable at start-up: checked the default agent only")
            agents = [self.default]
        for agent in agents:
            check = getattr(agent, "preflight", None)
            if callable(check):
                check()
