"""The pages' people: the owner's desk and client, and a stranger with a desk of their own."""

import pytest
from django.test import Client


@pytest.fixture
def desk(make_inbox, owner):
    return make_inbox("desk", owner=owner)


@pytest.fixture
def owner_client(owner):
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture
def stranger(django_user_model):
    return django_user_model.objects.create_user(username="stranger", password="pw-stranger-123")


@pytest.fixture
def stranger_desk(make_inbox, stranger):
    return make_inbox("other-desk", owner=stranger)
