"""The demo: the refund desk end to end."""
