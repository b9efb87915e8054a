"""People's accounts: login, passwords, and the login and password reset throttles
(django-axes; alwayson/web/views.py)."""

from datetime import timedelta

from . import env

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

# A username is locked out after this many failed logins in a row, from any address (by
# address alone, an attacker rotates addresses, and behind a proxy every user shares one);
# while locked out, the right password is refused too. The admin's login is the same gate.
AXES_FAILURE_LIMIT = env.positive_int("ALWAYSON_LOGIN_FAILURE_LIMIT", 5)
AXES_LOCKOUT_PARAMETERS = ["username"]
# Where axes reads the username: Django's login forms post it, and authenticate() receives it,
# as "username" whatever the user model's USERNAME_FIELD. axes' default is USERNAME_FIELD,
# under which a project logging in by email (tests/embedded) would lock nobody out.
AXES_USERNAME_FORM_FIELD = "username"
# axes.W006 asks for the address among the parameters, against a lock that rotating the
# User-Agent or cookies escapes; a lock per username escapes neither, nor a new address.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
# Seconds a lockout lasts after the last failure; also the password reset throttle's window.
ALWAYSON_LOGIN_COOLOFF = timedelta(
    seconds=env.seconds("ALWAYSON_LOGIN_COOLOFF", 900, env.MAX_INTERVAL)
)
AXES_COOLOFF_TIME = ALWAYSON_LOGIN_COOLOFF
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "alwayson.web.views.login_locked_out"
# Password reset emails per address per cool-off.
ALWAYSON_PASSWORD_RESET_LIMIT = env.positive_int("ALWAYSON_PASSWORD_RESET_LIMIT", 3)
