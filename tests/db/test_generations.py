"""Generation lifecycle services with the real database and the real Redis (broker queue, replay stream)."""

import pytest

from billing.models import DailyQuota, Tier, UsageRecord
from billing.quota import quota_day
from conversations import generation_worker, generations, reaper, reply_control, services
from conversations.admission import AdmissionRefused
from conversations.models import Conversation, Message
from conversations.selectors import ConversationNotFound
from events import broadcast
from tests.conftest import broker_take

pytestmark = pytest.mark.django_db


MODEL_QUEUE = "inference.smollm2-135m-instruct"


def test_send_stores_user_and_queued_reply_and_dispatches_on_commit(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        ticket = generations.reply_request(user=alice, conversation_id=None, content="  Hello there  ")
    conversation = Conversation.objects.get(owner=alice)
    assert conversation.title == "Hello there"
    user_msg, reply = conversation.messages.order_by("id")
    assert (user_msg.role, user_msg.content, user_msg.status) == ("user", "Hello there", "completed")
    assert (reply.role, reply.status, reply.content) == ("assistant", "queued", "")
    assert ticket.message == reply and ticket.user_message_id == user_msg.id and ticket.position == 1
    assert broker_take(MODEL_QUEUE) == [([reply.id], 0)]


def test_replies_go_to_the_model_queue_with_the_tier_priority_and_paid_is_delivered_first(
    alice, make_user, redis_clean, django_capture_on_commit_callbacks
):
    carol = make_user("carol", tier="paid")
    with django_capture_on_commit_callbacks(execute=True):
        free = generations.reply_request(user=alice, conversation_id=None, content="first, free")
    with django_capture_on_commit_callbacks(execute=True):
        paid = generations.reply_request(user=carol, conversation_id=None, content="second, paid")
    assert paid.position == 1  # ahead of the older free reply
    # RabbitMQ's priority queue delivers the later paid request before the earlier free one.
    assert broker_take(MODEL_QUEUE) == [([paid.message.id], 10), ([free.message.id], 0)]


@pytest.mark.parametrize("content", ["", "   ", "x" * 20001])
def test_invalid_content_is_refused_and_nothing_stored(alice, content, settings):
    settings.MAX_MESSAGE_CHARS = 20000
    with pytest.raises(generations.GenerationError) as exc:
        generations.reply_request(user=alice, conversation_id=None, content=content)
    assert exc.value.code == "invalid_request"
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_free_user_is_refused_a_second_concurrent_reply(alice, redis_clean):
    first = generations.reply_request(user=alice, conversation_id=None, content="one")
    with pytest.raises(AdmissionRefused) as exc:
        generations.reply_request(user=alice, conversation_id=None, content="two")
    assert exc.value.code == "too_many_generations" and exc.value.retry_after
    assert Message.objects.count() == 2 and Conversation.objects.count() == 1
    assert first.message.status == "queued"


def test_user_over_daily_quota_is_refused_until_midnight(alice, redis_clean):
    DailyQuota.objects.create(user=alice, day=quota_day(), used_tokens=alice.tier.tokens_per_day)
    with pytest.raises(AdmissionRefused) as exc:
        generations.reply_request(user=alice, conversation_id=None, content="hi")
    assert exc.value.code == "quota_exceeded" and 0 < exc.value.retry_after <= 86400
    assert not Message.objects.exists()
    assert DailyQuota.objects.get(user=alice).reserved_tokens == 0


def test_rate_limit_refuses_the_request_over_the_tier_rate(alice, redis_clean):
    Tier.objects.filter(name="free").update(requests_per_minute=2, max_concurrent_generations=10)
    alice.refresh_from_db()
    for i in range(2):
        generations.reply_request(user=alice, conversation_id=None, content=f"m{i}")
    with pytest.raises(AdmissionRefused) as exc:
        generations.reply_request(user=alice, conversation_id=None, content="m3")
    assert exc.value.code == "rate_limited" and exc.value.retry_after >= 1
    assert Message.objects.filter(role="user").count() == 2


def test_other_users_conversation_is_not_found(alice, bob, redis_clean):
    conversation = services.conversation_create(owner=alice)
    with pytest.raises(ConversationNotFound):
        generations.reply_request(user=bob, conversation_id=conversation.id, content="hi")
    assert not conversation.messages.exists()


def test_stop_of_queued_reply_cancels_it_and_worker_skips_it(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = reply_control.reply_cancel(user=alice, message_id=ticket.message.id)
    assert message.status == "cancelled" and message.finish_reason == "cancelled"
    assert generation_worker.generation_start(message_id=message.id) is None


def test_stop_of_streaming_reply_asks_the_worker(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    generation_worker.generation_start(message_id=ticket.message.id)
    message = reply_control.reply_cancel(user=alice, message_id=ticket.message.id)
    assert message.status == "streaming"
    assert broadcast.cancel_requested(message.id)


def test_finish_writes_once_and_records_usage(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    assert message.status == "streaming"
    generation_worker.generation_finish(
        message=message,
        status="completed",
        text="Hello!",
        finish_reason="stop",
        prompt_tokens=12,
        completion_tokens=3,
        ttft_ms=40,
        duration_ms=90,
    )
    stored = Message.objects.get(pk=message.pk)
    assert (stored.status, stored.content, stored.completion_tokens, stored.ttft_ms) == (
        "completed",
        "Hello!",
        3,
        40,
    )
    record = UsageRecord.objects.get()
    assert (record.user, record.message, record.prompt_tokens, record.completion_tokens) == (
        alice,
        stored,
        12,
        3,
    )
    # A second finish (e.g. a redelivered task) changes nothing.
    generation_worker.generation_finish(message=message, status="failed", text="", error="late")
    assert Message.objects.get(pk=message.pk).status == "completed"
    assert UsageRecord.objects.count() == 1


def test_generated_nul_is_stored_as_a_replacement_character_not_lost(alice, redis_clean):
    # A model can sample a token that decodes to NUL; PostgreSQL text refuses it, which used to fail the write.
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    generation_worker.generation_finish(
        message=message, status="completed", text="a\x00b", finish_reason="stop"
    )
    stored = Message.objects.get(pk=message.pk)
    assert (stored.status, stored.content) == ("completed", "a\ufffdb")

    ticket = generations.reply_request(user=alice, conversation_id=stored.conversation_id, content="again")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    broadcast.publish(message.id, broadcast.frame_token(message_id=message.id, seq=0, text="x\x00"))
    assert reaper.generations_reap_interrupted(is_alive=lambda _id: False, grace_s=0) == [message.id]
    stored = Message.objects.get(pk=message.pk)
    assert (stored.status, stored.content) == ("interrupted", "x\ufffd")


def test_history_excludes_empty_replies_and_later_messages(alice, redis_clean):
    conversation = services.conversation_create(owner=alice, system_prompt="Be brief.")
    services.message_create(conversation=conversation, role="user", content="q1")
    services.message_create(conversation=conversation, role="assistant", content="", status="failed")
    services.message_create(conversation=conversation, role="user", content="q2")
    reply = services.message_create(conversation=conversation, role="assistant", content="", status="queued")
    system, turns, _ids = generation_worker.generation_branch(message=reply)
    assert system == "Be brief."
    assert turns == [{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]


def test_branch_ids_line_up_with_the_turns_a_blocked_message_left_out_of_both(alice, redis_clean):
    """Memory's recall leaves out the turns inside the window by these ids (``turn_ids[omitted:]``): a blocked
    user message must be missing from the ids as from the turns, or the window's ids shift by one."""
    conversation = services.conversation_create(owner=alice)
    q1 = services.message_create(conversation=conversation, role="user", content="q1")
    a1 = services.message_create(conversation=conversation, role="assistant", content="a1")
    services.message_create(conversation=conversation, role="user", content="bad", status="blocked")
    q2 = services.message_create(conversation=conversation, role="user", content="q2")
    reply = services.message_create(conversation=conversation, role="assistant", content="", status="queued")
    _system, turns, ids = generation_worker.generation_branch(message=reply)
    assert [t["content"] for t in turns] == ["q1", "a1", "q2"]
    assert ids == [q1.pk, a1.pk, q2.pk]


def test_regenerate_keeps_the_last_reply_as_a_sibling(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    generation_worker.generation_finish(message=message, status="completed", text="old", finish_reason="stop")
    new = generations.reply_regenerate(user=alice, conversation_id=message.conversation_id)
    old = Message.objects.get(pk=message.pk)
    assert old.content == "old"
    assert new.message.status == "queued" and new.user_message_id is None
    assert new.message.parent_id == old.parent_id == ticket.user_message_id
    assert Message.objects.get(pk=ticket.user_message_id).active_child_id == new.message.id


def test_regenerate_answers_a_user_message_left_without_reply(alice, redis_clean):
    conversation = services.conversation_create(owner=alice)
    services.message_create(conversation=conversation, role="user", content="unanswered")
    ticket = generations.reply_regenerate(user=alice, conversation_id=conversation.id)
    assert ticket.message.status == "queued"
    assert list(conversation.messages.values_list("role", flat=True)) == ["user", "assistant"]


def test_regenerate_of_empty_conversation_is_refused(alice, redis_clean):
    conversation = services.conversation_create(owner=alice)
    with pytest.raises(generations.GenerationError):
        generations.reply_regenerate(user=alice, conversation_id=conversation.id)
    assert not conversation.messages.exists()


def test_regenerate_refuses_while_reply_active(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    with pytest.raises(generations.GenerationError):
        generations.reply_regenerate(user=alice, conversation_id=ticket.message.conversation_id)
    assert Message.objects.get(pk=ticket.message.pk).status == "queued"


def test_reaper_marks_orphaned_streaming_reply_interrupted_with_partial_text(alice, redis_clean):
    ticket = generations.reply_request(user=alice, conversation_id=None, content="hi")
    message = generation_worker.generation_start(message_id=ticket.message.id)
    for seq, text in enumerate(["Hel", "lo"]):
        broadcast.publish(message.id, broadcast.frame_token(message_id=message.id, seq=seq, text=text))
    assert reaper.generations_reap_interrupted(is_alive=lambda _id: True, grace_s=0) == []
    assert reaper.generations_reap_interrupted(is_alive=lambda _id: False, grace_s=0) == [message.id]
    stored = Message.objects.get(pk=message.pk)
    assert stored.status == "interrupted" and stored.content == "Hello" and stored.error


def test_reap_command_marks_only_replies_without_a_lease(alice, bob, redis_clean):
    from io import StringIO

    from django.core.management import call_command

    orphan = generation_worker.generation_start(
        message_id=generations.reply_request(user=alice, conversation_id=None, content="a").message.id
    )
    owned = generation_worker.generation_start(
        message_id=generations.reply_request(user=bob, conversation_id=None, content="b").message.id
    )
    redis_clean.set(broadcast.lease_key(owned.id), "worker-1", ex=60)
    out = StringIO()
    call_command("reap_interrupted", "--grace", "0", stdout=out)
    assert f"[{orphan.id}]" in out.getvalue()
    assert Message.objects.get(pk=orphan.pk).status == "interrupted"
    assert Message.objects.get(pk=owned.pk).status == "streaming"
