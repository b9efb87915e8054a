from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.db import models
from django.utils import timezone


class People(BaseUserManager):
    """create_user / create_superuser by email address, as `createsuperuser` and
    alwayson.testing call them."""

    use_in_migrations = True

    def create_user(self, email, password=None, **fields):
        if not email:
            raise ValueError("email is required")
        user = self.model(email=self.normalize_email(email), **fields)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email, password=None, **fields):
        fields.update(is_staff=True, is_superuser=True)
        return self.create_user(email, password, **fields)


class User(AbstractBaseUser, PermissionsMixin):
    """The stranger's own user model (AUTH_USER_MODEL = "accounts.User"): a table of its own,
    people log in by email address and there is no username at all, so alwayson must reach
    people through AUTH_USER_MODEL, USERNAME_FIELD and get_username() alone."""

    email = models.EmailField("email address", unique=True)
    name = models.CharField(max_length=100, blank=True)
    team = models.CharField(max_length=50, blank=True)
    is_staff = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    date_joined = models.DateTimeField(default=timezone.now)

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS = []

    objects = People()

    class Meta:
        db_table = "acme_people"
