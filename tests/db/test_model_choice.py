"""Choosing between the plan's models on the chat page: the ``model`` field of ``send``/``regenerate``/``edit``
frames over the real consumer and Redis channel layer, validated against the tier's models
(``inference.registry.models_for_tier``, the routing the API uses), remembered on the conversation, and
shown by the page."""

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.urls import reverse

from billing.models import Tier
from conversations import load, services
from conversations.models import Conversation, Message
from tests.sockets import open_socket

OWN = settings.INFERENCE_DEFAULT_MODEL
LIGHT = "loaddrill"  # an alias registered by the test settings; idle_fleet announces a worker for it
FOREIGN = "dbdrill"  # registered too, but no tier offers it


def offer_two_models() -> None:
    Tier.objects.filter(name="free").update(model_name=OWN, degrade_to_model=LIGHT)
    load.clear_cache()  # the consumer reads tiers through the 1 s cache


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@database_sync_to_async
def stored(model, **filters):
    return list(model.objects.filter(**filters))


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_chosen_model_answers_is_remembered_and_follows_regenerate(session_cookie, redis_clean):
    await database_sync_to_async(offer_two_models)()
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi", "model": LIGHT})
    queued = await ws.receive_json_from()
    assert (queued["type"], queued["model"]) == ("queued", LIGHT)
    cid = queued["conversation_id"]
    [conversation] = await stored(Conversation, pk=cid)
    assert conversation.model_name == LIGHT
    [reply] = await stored(Message, pk=queued["message_id"])
    assert reply.model_name == LIGHT

    # Regenerate without a model field keeps the conversation's choice.
    await database_sync_to_async(Message.objects.filter(pk=reply.pk).update)(status="completed")
    await ws.send_json_to({"type": "regenerate", "conversation_id": cid})
    again = await ws.receive_json_from()
    assert again["model"] == LIGHT

    # "" goes back to the tier's routing (its own model while it is not busy), and is remembered too.
    await database_sync_to_async(Message.objects.filter(pk=again["message_id"]).update)(status="completed")
    await ws.send_json_to({"type": "send", "conversation_id": cid, "content": "More", "model": ""})
    routed = await ws.receive_json_from()
    assert routed["model"] == OWN
    [conversation] = await stored(Conversation, pk=cid)
    assert conversation.model_name == ""
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("client_id", [None, "4b0f5d2e-8c1a-4f5e-9a57-0e6c1d2b3a4f"])
async def test_a_model_the_tier_does_not_offer_is_refused_and_nothing_is_stored(
    session_cookie, alice, redis_clean, client_id
):
    await database_sync_to_async(offer_two_models)()
    conversation = await database_sync_to_async(services.conversation_create)(owner=alice, title="t")
    ws = await open_socket(session_cookie)
    for target in (None, conversation.id):
        frame = {"type": "send", "conversation_id": target, "content": "Hi", "model": FOREIGN}
        if client_id:
            frame["client_id"] = client_id
        await ws.send_json_to(frame)
        error = await ws.receive_json_from()
        assert (error["type"], error["code"], error["retry_after"]) == ("error", "model_not_found", None)
        assert FOREIGN in error["message"]
    assert await stored(Message) == []
    assert [c.model_name for c in await stored(Conversation)] == [""]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_edit_with_a_foreign_model_is_refused_and_the_branch_is_untouched(
    session_cookie, alice, redis_clean
):
    conversation = await database_sync_to_async(services.conversation_create)(owner=alice, title="t")
    question = await database_sync_to_async(services.message_create)(
        conversation=conversation, role="user", content="Q"
    )
    ws = await open_socket(session_cookie)
    await ws.send_json_to({"type": "edit", "message_id": question.id, "content": "Q2", "model": LIGHT})
    error = await ws.receive_json_from()
    assert error["code"] == "model_not_found"  # the free tier offers one model here
    assert [m.content for m in await stored(Message)] == ["Q"]
    await ws.send_json_to({"type": "edit", "message_id": question.id, "content": "Q2", "model": OWN})
    assert (await ws.receive_json_from())["model"] == OWN
    await ws.disconnect()


@pytest.mark.django_db
def test_page_offers_a_picker_only_when_the_plan_has_several_models(client, alice):
    client.force_login(alice)
    page = client.get(reverse("conversations:new")).content.decode()
    assert 'id="model-select"' not in page and 'id="model-name"' in page and OWN in page

    offer_two_models()
    conversation = services.conversation_create(owner=alice, title="t")
    services.conversation_set_model(conversation=conversation, model_name=LIGHT)
    page = client.get(reverse("conversations:detail", args=[conversation.id])).content.decode()
    assert 'id="model-select"' in page
    assert f'<option value="{LIGHT}" selected>' in page
    # A remembered choice the plan no longer offers shows (and routes) as automatic.
    Tier.objects.filter(name="free").update(degrade_to_model="")
    offer = client.get(reverse("conversations:detail", args=[conversation.id])).content.decode()
    assert 'id="model-select"' not in offer
