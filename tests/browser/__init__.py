"""Playwright driving Chromium against a live server."""
