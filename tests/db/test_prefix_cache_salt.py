"""The worker passes the user as prefix-cache salt: a follow-up turn reuses the previous turn's KV cache, another
user sending the very same text never does. Real database and Redis, a real engine over a tiny random-weight
Llama with the product's tokenizer and chat template (no Celery: ``run_generation`` is what the task calls)."""

import pytest

from conversations import generations
from conversations.models import Conversation, Message
from conversations.reply_runner import run_generation
from inference.worker import WorkerHost

pytestmark = pytest.mark.django_db


def _reply(user, conversation_id, content, host) -> Message:
    ticket = generations.reply_request(user=user, conversation_id=conversation_id, content=content)
    assert run_generation(message_id=ticket.message.id, host=host) == "completed"
    return Message.objects.get(pk=ticket.message.id)


def test_follow_up_turn_hits_the_users_prefix_cache_and_no_one_elses(alice, bob, redis_clean, engine):
    host = WorkerHost(engine)
    first = _reply(alice, None, "Tell me how continuous batching works, in detail please.", host)
    conversation = Conversation.objects.get(owner=alice)
    hits = engine.load().prefix_cache_hit_tokens_total

    second = _reply(alice, conversation.id, "And what does prefix caching add to it?", host)
    reused = engine.load().prefix_cache_hit_tokens_total - hits
    # The second prompt re-sends the history, so it starts with the first turn's blocks (16 tokens each).
    assert second.status == "completed" and reused >= 16

    # Bob sends exactly Alice's first message: same prompt tokens, other salt, no hit.
    hits = engine.load().prefix_cache_hit_tokens_total
    bobs = _reply(bob, None, "Tell me how continuous batching works, in detail please.", host)
    assert bobs.prompt_tokens == first.prompt_tokens
    assert engine.load().prefix_cache_hit_tokens_total == hits
