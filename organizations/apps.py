from django.apps import AppConfig


class OrganizationsConfig(AppConfig):
    name = "organizations"
    default_auto_field = "django.db.models.BigAutoField"
