"""``manage.py create_api_key USER [--name NAME]``: create an API key for a user and print it once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from api.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key for USER (username or email) and print its secret (shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("user", help="username or email")
        parser.add_argument("--name", default="", help="a label for the key")

    def handle(self, *args, user, name, **options):
        users = get_user_model().objects
        account = users.filter(username=user).first() or users.filter(email__iexact=user).first()
        if account is None:
            raise CommandError(f"no user {user!r}")
        if not account.is_active:
            raise CommandError(f"user {user!r} is inactive; its keys would not work")
        api_key, raw_key = api_key_create(user=account, name=name)
        self.stderr.write(
            f"created key cs-{api_key.prefix}_… for {account.get_username()}; it is shown only once:"
        )
        self.stdout.write(raw_key)
