"""What test modules share: helpers, loopback servers, test agents and tools.

No test module imports another; what two of them need lives here, in a module named for what
it is. Fixtures stay in conftest.py files (tests/conftest.py, or a folder's own).
"""
