"""Default plan values, used by the data migrations and by ``manage.py bootstrap``.

Admission thresholds (``admit_max_wait_s``, seconds of expected wait, see ``conversations/load.py``): free
requests are refused first (10 s), paid ones only past 60 s; ``ADMISSION_HARD_CAP_WAIT_S`` refuses everyone.
"""

#: Fields added by migration 0003 (tiers under load), set on existing rows by its data step.
LOAD_FIELDS = (
    "admit_max_wait_s",
    "degrade_to_model",
    "degrade_after_wait_s",
    "backoff_kind",
    "backoff_base_s",
    "backoff_cap_s",
)

DEFAULT_TIERS = {
    "free": dict(
        display_name="Free",
        model_name="smollm2-135m-instruct",
        requests_per_minute=10,
        tokens_per_day=50_000,
        max_reply_tokens=512,
        max_context_tokens=2048,
        queue_priority=0,
        max_concurrent_generations=1,
        admit_max_wait_s=10.0,
        degrade_to_model="",
        degrade_after_wait_s=5.0,
        backoff_kind="exponential",
        backoff_base_s=10,
        backoff_cap_s=160,
        memory_budget_tokens=256,
    ),
    "paid": dict(
        display_name="Paid",
        model_name="smollm2-135m-instruct",
        requests_per_minute=60,
        tokens_per_day=1_000_000,
        max_reply_tokens=2048,
        max_context_tokens=8192,
        queue_priority=10,
        max_concurrent_generations=4,
        admit_max_wait_s=60.0,
        degrade_to_model="",
        degrade_after_wait_s=60.0,
        backoff_kind="linear",
        backoff_base_s=10,
        backoff_cap_s=10,
        memory_budget_tokens=1024,
    ),
}
