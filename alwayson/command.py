"""The base of every alwayson management command."""

from django.core.management.base import BaseCommand

import alwayson


class AlwaysonCommand(BaseCommand):
    def get_version(self):
        return alwayson.__version__  # --version: alwayson's, not Django's
