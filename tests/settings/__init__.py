"""The project's settings: production defaults, safe defaults, throttles."""
