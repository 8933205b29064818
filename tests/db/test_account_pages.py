"""Account pages: default system prompt, password change and reset, account deletion."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.urls import reverse

from billing.models import UsageRecord
from conversations import generations, services
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


def test_default_system_prompt_starts_new_conversations(client, alice, redis_clean):
    client.force_login(alice)
    response = client.post(
        reverse("accounts:default_system_prompt"), {"default_system_prompt": "Answer in French."}
    )
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.default_system_prompt == "Answer in French."
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hello")
    assert Conversation.objects.get(pk=ticket.message.conversation_id).system_prompt == "Answer in French."


def test_conversation_system_prompt_can_be_changed(client, alice):
    conversation = services.conversation_create(owner=alice)
    client.force_login(alice)
    client.post(reverse("conversations:system_prompt", args=[conversation.id]), {"system_prompt": "Pirate."})
    conversation.refresh_from_db()
    assert conversation.system_prompt == "Pirate."


def test_password_change(client, alice):
    client.force_login(alice)
    response = client.post(
        reverse("accounts:password_change"),
        {
            "old_password": "pw-Secret-123",
            "new_password1": "n3w-Secret-456",
            "new_password2": "n3w-Secret-456",
        },
    )
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password("n3w-Secret-456")


def test_password_reset_by_email(client, alice):
    response = client.post(reverse("accounts:password_reset"), {"email": alice.email})
    assert response.status_code == 302 and len(mail.outbox) == 1
    link = re.search(r"https?://[^\s]+/password/reset/[^\s]+/", mail.outbox[0].body).group(0)
    path = link.split("://", 1)[1].split("/", 1)[1]
    form_page = client.get("/" + path, follow=True)
    assert form_page.status_code == 200 and form_page.context["validlink"]
    response = client.post(
        form_page.redirect_chain[-1][0],
        {"new_password1": "Re5et-Secret-9", "new_password2": "Re5et-Secret-9"},
    )
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password("Re5et-Secret-9")


def test_account_deletion_removes_the_users_data(client, alice, bob):
    mine = services.conversation_create(owner=alice, title="mine")
    message = services.message_create(conversation=mine, role="assistant", content="x")
    UsageRecord.objects.create(
        user=alice, message=message, model_name="m", prompt_tokens=1, completion_tokens=1
    )
    services.conversation_create(owner=bob, title="bob's")
    client.force_login(alice)
    refused = client.post(reverse("accounts:delete"), {"password": "wrong", "confirm": "delete my account"})
    assert refused.status_code == 400 and get_user_model().objects.filter(pk=alice.pk).exists()
    response = client.post(
        reverse("accounts:delete"), {"password": "pw-Secret-123", "confirm": "delete my account"}
    )
    assert response.status_code == 302
    assert not get_user_model().objects.filter(pk=alice.pk).exists()
    assert not Conversation.objects.filter(owner_id=alice.pk).exists()
    assert not Message.objects.filter(conversation__owner_id=alice.pk).exists()
    assert not UsageRecord.objects.filter(user_id=alice.pk).exists()
    assert Conversation.objects.filter(owner=bob).count() == 1
