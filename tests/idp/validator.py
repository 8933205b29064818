"""The identity provider's claims: e-mail, preferred_username and the person's groups (Django groups)."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsValidator(OAuth2Validator):
    # Every claim below goes into the ID token and the userinfo answer, whatever the scopes.
    oidc_claim_scope = None

    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            "email_verified": True,
            "preferred_username": user.username,
            "name": user.get_full_name() or user.username,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
