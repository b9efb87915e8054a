"""The runtime: Run and its verbs, the worker, runworker, the scenarios command."""
