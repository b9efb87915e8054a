"""Django's development server as `runall` starts it: runserver (staticfiles' when installed,
serving the static files), whose start-up check for unapplied migrations waits out a database
server it cannot reach, within START_OUTAGE, as runall's own start-up and every loop's do.

runserver's check reads the database once before it serves and exits on any error. Started
while PostgreSQL restarted or failed over (or its network was silent), it died, and runall,
seeing a child die, stopped the whole set: a chaos run's failover (seed 974326) was a process
that died on its own. A database that does not exist is no outage: it is raised at once
(through_outage), as before.
"""

from django.apps import apps

from alwayson.command import AlwaysonCommand
from alwayson.ops.database import START_OUTAGE, through_outage

if apps.is_installed("django.contrib.staticfiles"):
    from django.contrib.staticfiles.management.commands.runserver import Command as RunServer
else:
    from django.core.management.commands.runserver import Command as RunServer


class Command(RunServer, AlwaysonCommand):  # AlwaysonCommand's --version
    help = (
        "Django's development server (runserver), its start-up waiting out a database server"
        " it cannot reach, as runall's loops do: what `runall` starts for the web."
    )

    def check_migrations(self):
        through_outage(super().check_migrations, START_OUTAGE, self.stderr.write)
