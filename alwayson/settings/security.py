"""Hosts, HTTPS, cookies and the proxy in front (issue 12).

Every default follows DEBUG: with DEBUG on, development over plain http keeps working; with
DEBUG off, the defaults are the secure ones and `manage.py check --deploy` has nothing to
report (given a real SECRET_KEY, and on Django 6.1+ a real EMAIL_URL). Each can be set on
its own from the environment.
"""

from . import env
from .base import DEBUG

ALLOWED_HOSTS = env.string_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

SECURE_SSL_REDIRECT = env.strict_bool("SECURE_SSL_REDIRECT", not DEBUG)
# A year, the figure the HSTS preload list asks for. 0 sends no header.
SECURE_HSTS_SECONDS = env.seconds_or_zero(
    "SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, env.MAX_HSTS
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.strict_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
# Only the header's `preload` token: a domain joins the browsers' list when someone submits it.
SECURE_HSTS_PRELOAD = env.strict_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env.strict_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env.strict_bool("CSRF_COOKIE_SECURE", not DEBUG)
CSRF_TRUSTED_ORIGINS = env.trusted_origins("CSRF_TRUSTED_ORIGINS")
SECURE_PROXY_SSL_HEADER = env.proxy_ssl_header("SECURE_PROXY_SSL_HEADER")
