"""``python -m tests.idp.setup REDIRECT_URI...``: the identity provider's database: migrated, one person
(``ivy`` / ``ivy-Secret-123``, groups ``engineering`` and ``admins``) and chatsite's client
(``chatsite`` / ``chatsite-secret``, confidential, RS256 ID tokens, no consent screen)."""

import sys

import django


def main(redirect_uris: list[str]) -> None:
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    ivy = User.objects.create_user(
        "ivy", email="ivy@corp.example", password="ivy-Secret-123", first_name="Ivy"
    )
    for name in ("engineering", "admins"):
        ivy.groups.add(Group.objects.create(name=name))
    Application.objects.create(
        name="chatsite",
        client_id="chatsite",
        client_secret="chatsite-secret",
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(redirect_uris),
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
