"""Default plan values, used by the data migration and by ``manage.py bootstrap``."""

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
        queue_name="inference.free",
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
        queue_name="inference.paid",
    ),
}
