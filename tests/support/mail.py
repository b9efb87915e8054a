"""Django's email, pointed where a test wants it."""


def use_email_backend(settings, backend, **smtp):
    """Point Django's email at `backend` (and SMTP options: host, port, username, password,
    use_tls, use_ssl, timeout) through MAILERS on Django 6.1+, EMAIL_* before it."""
    if hasattr(settings, "MAILERS"):
        settings.MAILERS = {"default": {"BACKEND": backend, "OPTIONS": smtp}}
        return
    settings.EMAIL_BACKEND = backend
    names = {
        "host": "EMAIL_HOST",
        "port": "EMAIL_PORT",
        "username": "EMAIL_HOST_USER",
        "password": "EMAIL_HOST_PASSWORD",
        "use_tls": "EMAIL_USE_TLS",
        "use_ssl": "EMAIL_USE_SSL",
        "timeout": "EMAIL_TIMEOUT",
    }
    for option, value in smtp.items():
        setattr(settings, names[option], value)
