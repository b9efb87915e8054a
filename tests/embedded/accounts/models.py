from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    """The stranger's own user model (AUTH_USER_MODEL = "accounts.User"), a table of its own
    and a unique email address: alwayson must reach it only through AUTH_USER_MODEL."""

    email = models.EmailField("email address", unique=True)
    team = models.CharField(max_length=50, blank=True)

    class Meta:
        db_table = "acme_people"
