from django.urls import path

from billing import stripe_views, team_views, views

app_name = "billing"
urlpatterns = [
    path("usage/", views.usage, name="usage"),
    path("upgrade/", views.upgrade, name="upgrade"),
    path("upgrade/<int:request_id>/cancel/", views.upgrade_cancel, name="upgrade_cancel"),
    # Stripe (issue 32): the public webhook endpoint and the customer portal.
    path("stripe/webhook/", stripe_views.stripe_webhook, name="stripe_webhook"),
    path("portal/", stripe_views.billing_portal, name="portal"),
    # Teams
    path("team/", team_views.team, name="team"),
    path("team/create/", team_views.team_create, name="team_create"),
    path("team/invite/", team_views.team_invite, name="team_invite"),
    path("team/members/<int:user_id>/", team_views.team_member_update, name="team_member_update"),
    path("team/members/<int:user_id>/remove/", team_views.team_member_remove, name="team_member_remove"),
    path("team/join/<str:token>/", team_views.team_join_view, name="team_join"),
]
