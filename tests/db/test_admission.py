"""Admission control on the fleet's expected wait, with worker statuses published to the real test Redis
and replies queued in the real database (no mocks of our own code)."""

import time

import pytest
from django.db import transaction

from billing.models import DailyQuota, QuotaReservation, Tier
from conversations import admission, generations, load, services
from conversations.admission import AdmissionRefused, admission_check, prompt_tokens_upper_bound
from conversations.models import Message
from tests.db.conftest import fake_worker, publish_worker

pytestmark = [pytest.mark.django_db, pytest.mark.real_fleet]

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def fleet_settings(settings):
    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0  # so one request ahead = 1 s of expected wait
    settings.ADMISSION_HARD_CAP_WAIT_S = 120.0
    return settings


@pytest.fixture
def carol(make_user):
    return make_user("carol", tier="paid")


def in_engine(count: int, *, model: str = MODEL, tier: str = "free") -> None:
    """``count`` replies of a ``tier`` user that a worker claimed (``streaming``): in an engine, waiting."""
    if not count:
        return
    from django.contrib.auth import get_user_model

    from billing.services import tiers_ensure

    tiers_ensure()
    filler, _ = get_user_model().objects.get_or_create(
        username=f"filler-{tier}", defaults={"tier": Tier.objects.get(name=tier)}
    )
    conversation = services.conversation_create(owner=filler)
    for _ in range(count):
        services.message_create(
            conversation=conversation, role="assistant", content="", status="streaming", model_name=model
        )


def saturate(
    waiting: int, *, model: str = MODEL, tier: str = "free", index: int = 0, running: int = 4, **extra
) -> None:
    """A worker whose engine runs ``running`` requests and has ``waiting`` more waiting, all of ``tier``
    users (stored as ``streaming`` replies, as a worker's claimed replies are). Its running slots are all
    taken (``max_num_seqs`` = ``running`` unless given), so queued replies wait for slots to free."""
    in_engine(running + waiting, model=model, tier=tier)
    extra.setdefault("max_num_seqs", running)
    publish_worker(fake_worker(model, index=index, waiting=waiting, running=running, **extra))


def send(user, content="hi"):
    return generations.reply_request(user=user, conversation_id=None, content=content)


def test_free_is_refused_above_its_threshold_while_paid_is_admitted(
    alice, carol, fleet_settings, redis_clean
):
    saturate(waiting=20)  # expected wait 20 s: above free's 10 s, below paid's 60 s
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(20.0)
    with pytest.raises(AdmissionRefused) as refused:
        send(alice)
    assert refused.value.code == "busy" and refused.value.retry_after == 10  # ~ 20 s - 10 s threshold
    assert not Message.objects.filter(conversation__owner=alice).exists()
    assert not DailyQuota.objects.filter(user=alice, reserved_tokens__gt=0).exists()

    ticket = send(carol)
    assert ticket.message.status == Message.Status.QUEUED
    assert QuotaReservation.objects.get(message=ticket.message).tokens > 0


def test_a_frame_its_cached_gate_admitted_is_not_refused_busy_again_by_the_service(
    alice, fleet_settings, redis_clean
):
    """The consumer's gate decided the load for a frame (admission.gate_passed): the service's admission does
    not refuse it ``busy`` on figures that now count later frames ahead of it, but still reserves its quota
    and applies the concurrency cap; a decision for another model than the one routed to counts for nothing."""
    saturate(waiting=20)  # 20 s: above free's 10 s threshold
    with admission.gate_passed(MODEL):
        ticket = send(alice)
    assert ticket.message.status == Message.Status.QUEUED
    assert QuotaReservation.objects.get(message=ticket.message).tokens > 0
    with admission.gate_passed("another-model"), pytest.raises(AdmissionRefused) as refused:
        send(alice, "again")
    assert refused.value.code == "busy"
    with admission.gate_passed(MODEL), pytest.raises(AdmissionRefused) as refused:
        send(alice, "and again")
    assert refused.value.code == "too_many_generations"  # the exact checks stay
    assert Message.objects.filter(conversation__owner=alice, role="user").count() == 1


def test_everyone_is_admitted_again_when_the_wait_falls_below_the_threshold(
    alice, fleet_settings, redis_clean
):
    saturate(waiting=20)
    with pytest.raises(AdmissionRefused):
        send(alice)
    for message in Message.objects.filter(status="streaming")[:15]:  # 15 of them finished
        Message.objects.filter(pk=message.pk).update(status="completed")
    publish_worker(fake_worker(MODEL, waiting=5, running=4))
    assert send(alice).message.status == Message.Status.QUEUED


def test_beyond_the_hard_cap_everyone_is_refused(alice, carol, fleet_settings, redis_clean):
    saturate(waiting=150, tier="paid")
    for user in (alice, carol):
        with pytest.raises(AdmissionRefused) as refused:
            send(user)
        assert refused.value.code == "busy" and refused.value.retry_after >= 5
    assert not Message.objects.filter(conversation__owner__in=[alice, carol]).exists()


def test_queued_free_replies_delay_free_requests_but_not_paid_ones(
    alice, bob, carol, fleet_settings, redis_clean
):
    """A paid request overtakes queued free ones in the broker, so they are not ahead of it."""
    saturate(waiting=0)
    conversation = services.conversation_create(owner=bob)
    for _ in range(15):
        services.message_create(
            conversation=conversation, role="assistant", content="", status="queued", model_name=MODEL
        )
    load.clear_cache()
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(15.0)
    assert load.expected_wait_s(tier=carol.tier) == 0.0
    with pytest.raises(AdmissionRefused):
        send(alice)
    assert send(carol).message.status == Message.Status.QUEUED


def test_no_live_worker_refuses_at_once_with_no_workers(alice, carol, fleet_settings, redis_clean):
    for user in (alice, carol):
        with pytest.raises(AdmissionRefused) as refused:
            send(user)
        assert refused.value.code == "no_workers" and refused.value.retry_after
    assert not Message.objects.exists()


def test_a_draining_or_expired_worker_does_not_count(alice, fleet_settings, redis_clean):
    publish_worker(fake_worker(MODEL, draining=True))
    with pytest.raises(AdmissionRefused) as refused:
        send(alice)
    assert refused.value.code == "no_workers"
    redis_clean.delete(*redis_clean.keys("chatsite:worker:*"))
    publish_worker(fake_worker(MODEL), ttl_s=1)
    assert send(alice).message.status == Message.Status.QUEUED
    import time

    time.sleep(1.2)
    load.clear_cache()
    with pytest.raises(AdmissionRefused) as refused:
        generations.reply_request(user=alice, conversation_id=None, content="again")
    assert refused.value.code in ("no_workers", "too_many_generations")
    assert refused.value.code == "no_workers"  # load is checked first


def test_a_burst_inside_one_cache_period_is_not_admitted_on_the_same_stale_figure(
    make_user, fleet_settings, redis_clean
):
    fleet_settings.ADMISSION_LOAD_CACHE_S = 60.0  # every admission below reads the same cached figures
    saturate(waiting=0)
    outcomes = []
    for i in range(14):
        try:
            send(make_user(f"burst{i}"))
            outcomes.append("queued")
        except AdmissionRefused as exc:
            outcomes.append(exc.code)
    # Each admitted request adds 1 s of expected wait: the free threshold (10 s) stops the burst.
    assert outcomes == ["queued"] * 11 + ["busy"] * 3


def test_free_requests_waiting_in_an_engine_are_not_ahead_of_paid_ones(
    alice, carol, fleet_settings, redis_clean
):
    """Engines admit by priority: free requests waiting there do not delay a paid request."""
    saturate(waiting=30)
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(30.0)
    assert load.expected_wait_s(tier=carol.tier) == 0.0
    in_engine(4, tier="paid")  # 4 paid requests running: none of them is waiting
    load.clear_cache()
    assert load.expected_wait_s(tier=carol.tier) == 0.0
    in_engine(7, tier="paid")  # 11 paid ones, 4 running slots (fleet says running=4): 7 are waiting
    load.clear_cache()
    assert load.expected_wait_s(tier=carol.tier) == pytest.approx(7.0)


def test_a_saturated_fleet_teaches_admission_its_real_decode_rate(alice, fleet_settings, redis_clean):
    saturate(waiting=10, decode_tokens_per_s=50.0)  # measured while saturated: 50 tok/s, not the 100 assumed
    # One reading lowers the estimate by a tenth (a window full of prefill reads low) ...
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(10 * 100 / 90)
    for _ in range(10):  # ... a rate read again and again is learned
        load.forget_reads()
        load.fleet_load()
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(10 * 100 / 50)
    Message.objects.filter(status="streaming").update(status="completed")
    # every slot taken (no free slot to start in), nothing waiting: the rate read now is not a capacity
    publish_worker(fake_worker(MODEL, waiting=0, running=32, decode_tokens_per_s=20.0))
    in_engine(0)
    conversation = services.conversation_create(owner=alice)
    services.message_create(
        conversation=conversation, role="assistant", content="", status="queued", model_name=MODEL
    )
    load.forget_reads()  # keep the learned capacity
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(1 * 100 / 50)


def test_after_an_idle_spell_a_bursts_first_low_reading_moves_the_capacity_by_a_tenth(
    alice, fleet_settings, redis_clean
):
    """Idle time says nothing about capacity: a prefill-heavy first reading of a burst (5 tok/s) after an idle
    spell lowers a learned 200 tok/s by 10 %, not to 5 (one request ahead would read as 20 s of wait)."""
    fleet_settings.ADMISSION_LOAD_CACHE_S = 0.01  # the unit a wall-clock decay would have counted in
    publish_worker(fake_worker(MODEL, waiting=5, running=4, max_num_seqs=4, decode_tokens_per_s=200.0))
    assert load.fleet_load()[MODEL].decode_tokens_per_s == pytest.approx(200.0)
    publish_worker(fake_worker(MODEL, waiting=0, running=0, decode_tokens_per_s=0.0))  # idle
    assert load.fleet_load()[MODEL].decode_tokens_per_s == pytest.approx(200.0)
    time.sleep(0.3)
    publish_worker(fake_worker(MODEL, waiting=5, running=4, max_num_seqs=4, decode_tokens_per_s=5.0))
    assert load.fleet_load()[MODEL].decode_tokens_per_s == pytest.approx(180.0)
    publish_worker(fake_worker(MODEL, waiting=5, running=4, max_num_seqs=4, decode_tokens_per_s=400.0))
    assert load.fleet_load()[MODEL].decode_tokens_per_s == pytest.approx(400.0)  # a higher one at once


def test_queued_replies_that_fit_the_free_slots_wait_for_nothing(alice, fleet_settings, redis_clean):
    """A burst to an engine with free running slots starts at once: only the replies beyond the free slots
    wait (a continuously batched engine takes up to ``max_num_seqs`` at once)."""
    publish_worker(fake_worker(MODEL, waiting=0, running=2))  # 30 of its 32 slots free
    conversation = services.conversation_create(owner=alice)
    for _ in range(30):
        services.message_create(
            conversation=conversation, role="assistant", content="", status="queued", model_name=MODEL
        )
    load.forget_reads()
    assert load.fleet_load()[MODEL].free_slots == 30
    assert load.expected_wait_s(tier=alice.tier) == 0.0
    for _ in range(8):
        services.message_create(
            conversation=conversation, role="assistant", content="", status="queued", model_name=MODEL
        )
    load.forget_reads()
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(8 * 100 / 100)  # 38 queued, 30 free
    publish_worker(fake_worker(MODEL, waiting=1, running=2))  # something waits there: no slot to give
    assert load.fleet_load()[MODEL].free_slots == 0
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(38 * 100 / 100 + 0)


def test_fleet_read_is_cached_for_a_second(alice, fleet_settings, redis_clean):
    saturate(waiting=0)
    assert load.expected_wait_s(tier=alice.tier) == 0.0
    saturate(waiting=30)  # publish_worker clears the cache; a worker's own publish does not
    load.fleet_load()
    redis_clean.delete(*redis_clean.keys("chatsite:worker:*"))
    assert load.expected_wait_s(tier=alice.tier) == pytest.approx(30.0)  # still the cached read


@pytest.fixture
def two_models(fleet_settings):
    """Two registry entries (same weights, different names): the tier's own model and a lighter fallback."""
    base = dict(fleet_settings.INFERENCE_MODELS[MODEL])
    fleet_settings.INFERENCE_MODELS = {"big": base, "small": base}
    Tier.objects.filter(name="free").update(
        model_name="big", degrade_to_model="small", degrade_after_wait_s=5, admit_max_wait_s=10
    )
    return fleet_settings


def test_free_tier_moves_to_its_degrade_model_under_load_and_is_told(make_user, two_models, redis_clean):
    dave = make_user("dave")
    saturate(waiting=8, model="big")  # 8 s: over degrade_after (5), under admit (10)
    publish_worker(fake_worker("small", index=1))
    ticket = send(dave)
    assert ticket.message.model_name == "small"
    assert "small" in ticket.notice
    frame = generations.broadcast.frame_queued(
        message=ticket.message, user_message_id=ticket.user_message_id, position=1, notice=ticket.notice
    )
    assert frame["model"] == "small" and frame["notice"]


def test_free_tier_keeps_its_model_when_load_is_low(make_user, two_models, redis_clean):
    dave = make_user("dave")
    saturate(waiting=2, model="big")
    publish_worker(fake_worker("small", index=1))
    ticket = send(dave)
    assert ticket.message.model_name == "big" and ticket.notice == ""


def test_degrade_model_serves_when_the_own_model_has_no_worker(make_user, two_models, redis_clean):
    dave = make_user("dave")
    publish_worker(fake_worker("small", index=1))
    assert send(dave).message.model_name == "small"


def test_degraded_request_is_still_refused_when_the_fallback_is_over_the_threshold(
    make_user, two_models, redis_clean
):
    dave = make_user("dave")
    saturate(waiting=30, model="big")
    saturate(waiting=20, model="small", index=1)
    with pytest.raises(AdmissionRefused) as refused:
        send(dave)
    assert refused.value.code == "busy"


def test_prompt_bound_is_never_below_the_real_prompt(alice, redis_clean):
    """Byte-level BPE never makes more tokens than bytes; checked against the real tokenizer's template."""
    pytest.importorskip("transformers")
    from inference.registry import model_spec

    conversation = services.conversation_create(owner=alice, title="t")
    conversation.system_prompt = "Réponds en français. 🙂"
    conversation.save(update_fields=["system_prompt"])
    for role, text in [("user", "Bonjour, ça va ? 日本語も"), ("assistant", "Très bien ! " * 20)]:
        services.message_create(conversation=conversation, role=role, content=text)
    bound = prompt_tokens_upper_bound(conversation=conversation, new_content="Et toi ? 🚀")
    try:
        from transformers import AutoTokenizer

        from inference.engine import prepare_model

        path = prepare_model(model_spec(), generations.settings.MODEL_CACHE_DIR)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # the converted model is not available in this checkout
        pytest.skip(f"no local tokenizer: {exc}")
    turns = [{"role": "system", "content": conversation.system_prompt}]
    turns += [{"role": m.role, "content": m.content} for m in conversation.messages.order_by("id")]
    turns.append({"role": "user", "content": "Et toi ? 🚀"})
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True)
    assert len(ids) <= bound


def test_a_rolled_back_admission_holds_no_quota(alice, fleet_settings, redis_clean):
    saturate(waiting=0)
    with transaction.atomic():
        admission = admission_check(user=alice)
        assert admission.quota is not None and admission.reserved_tokens == alice.tier.max_context_tokens
        transaction.set_rollback(True)
    assert not DailyQuota.objects.filter(reserved_tokens__gt=0).exists()


def test_cached_only_reads_serve_fresh_figures_and_miss_otherwise(alice, fleet_settings, redis_clean):
    from conversations.admission import load_gate_for_user

    saturate(waiting=0)
    with pytest.raises(load.CacheMiss), load.cached_only():
        load_gate_for_user(user=alice)
    assert load_gate_for_user(user=alice)[1] == 0.0  # fills the cache
    with load.cached_only():
        assert load_gate_for_user(user=alice)[0] == MODEL


def test_warm_reads_every_figure_of_the_users_tiers_in_one_pass(alice, carol, fleet_settings, redis_clean):
    """``load.warm`` (the web process's warmer, for the users of its open sockets) fills what the consumer's
    ``cached_only`` gate reads, and reads a tier change again once its figure is half a period old."""
    from conversations.admission import load_gate_for_user

    saturate(waiting=0)
    load.warm(user_ids=[alice.pk, carol.pk])
    with load.cached_only():
        assert load_gate_for_user(user=alice)[0] == MODEL
        assert load_gate_for_user(user=carol)[0] == MODEL
    type(alice).objects.filter(pk=alice.pk).update(tier=Tier.objects.get(name="paid"))  # as a bulk edit does
    fleet_settings.ADMISSION_LOAD_CACHE_S = 0.0  # every figure is due again
    load.warm(user_ids=[alice.pk])
    fleet_settings.ADMISSION_LOAD_CACHE_S = 60.0
    with load.cached_only():
        load_gate_for_user(user=alice)
    assert alice.tier.name == "paid"


def test_the_warmer_pass_warms_figures_and_verifies_open_sockets_sessions(alice, fleet_settings, redis_clean):
    from django.test import Client

    from conversations import load_warmer
    from conversations.admission import load_gate_for_user

    saturate(waiting=0)
    browser = Client()
    browser.force_login(alice)
    socket = {"session_key": browser.session.session_key, "user_id": alice.pk}
    load_warmer.socket_opened(**socket)
    try:
        load_warmer.warm_once()
        assert load_warmer.session_verified(**socket)
        with load.cached_only():
            assert load_gate_for_user(user=alice)[0] == MODEL
        browser.session.flush()
        fleet_settings.ADMISSION_LOAD_CACHE_S = 0.0  # the next pass reads everything again
        load_warmer.warm_once()
        fleet_settings.ADMISSION_LOAD_CACHE_S = 60.0
        assert not load_warmer.session_verified(**socket)
    finally:
        load_warmer.socket_closed(**socket)


def test_a_request_let_through_the_cached_gate_counts_as_queued_until_cleared(
    alice, fleet_settings, redis_clean
):
    saturate(waiting=0)
    assert load.queued_ahead(model_name=MODEL, priority=0) == 0
    token = load.note_pending(model_name=MODEL, priority=10)
    assert load.queued_ahead(model_name=MODEL, priority=0) == 1  # a paid request is ahead of a free one
    assert load.queued_ahead(model_name=MODEL, priority=11) == 0
    load.clear_pending(token)
    load.clear_pending(token)  # twice: nothing
    assert load.queued_ahead(model_name=MODEL, priority=0) == 0
