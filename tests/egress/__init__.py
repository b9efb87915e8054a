"""Egress: the gateway, credentials that never leak, the Slack and Telegram channels."""
