"""The chat consumer's admission gate (:class:`AdmissionGateMixin`): a ``send`` or ``regenerate`` frame is
refused from cached figures on the event loop when it can be (``refusal_from_memory``), and the
reply-creating service it is let through to runs on a worker thread that first checks the socket's session
(``admitting``), so an admitted frame costs one thread hop for both (docs/overhead.md, "Admission")."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from accounts.sessions import session_is_current
from conversations import admission, load, load_warmer, refusals
from conversations.admission import AdmissionRefused
from conversations.protocol import RegenerateFrame, SendFrame
from database.connections import db_call
from observability import metrics

_service_pool: tuple[int, ThreadPoolExecutor] | None = None  # (its size, the pool)
_service_pool_lock = threading.Lock()


def reply_service_pool() -> ThreadPoolExecutor:
    """This process's ``REPLY_SERVICE_THREADS`` threads (default 3) for the reply-creating services of chat
    sockets (``send``, ``regenerate``: ~20-30 ms of ORM work and SQL each) and of API completions (the key
    check and the reply's transaction, ``api/v1.py``: lever 37), created on first use.

    Why a pool of their own: they ran on the event loop's default executor (``min(32, CPUs + 4)`` threads, 6
    on 2 CPUs), which also serves every other frame's database call. A wave of 32 sends filled it, and a
    refusal decided from memory whose session check (``session_is_current``) queued behind them was answered
    0.3-0.45 s later (refusal p99 with the engine saturated; docs/overhead-levers.md, lever 13). Fewer threads also
    leave the event loop fewer rivals for the GIL."""
    global _service_pool
    size = max(1, settings.REPLY_SERVICE_THREADS)
    with _service_pool_lock:
        if _service_pool is None or _service_pool[0] != size:  # first use, or a changed setting (tests)
            _service_pool = (size, ThreadPoolExecutor(max_workers=size, thread_name_prefix="reply-service"))
        return _service_pool[1]


class SessionEnded(Exception):
    """The socket's session no longer signs its user in (checked on the service's thread): nothing stored."""


class AdmissionGateMixin:
    """Admission methods of ``ChatConsumer`` (``self.user``, ``self.session_key``, ``self.pending``)."""

    def refusal_from_memory(self, frame) -> AdmissionRefused | None:
        """The load gate's refusal of a ``send`` (but not a ``resend``: that one may be answered from its
        stored ticket) or ``regenerate`` frame, decided from cached figures only (the user's current tier,
        the fleet, the queue; kept warm by :mod:`conversations.load_warmer`); None when admitted, another
        frame type, or a figure is not cached (then :meth:`dispatch_frame` decides as before)."""
        if not (isinstance(frame, RegenerateFrame) or (isinstance(frame, SendFrame) and not frame.resend)):
            return None
        load_warmer.note_activity()
        try:
            with load.cached_only():
                model_name, _, _ = admission.load_gate_for_user(user=self.user, model_name=frame.model or "")
        except load.CacheMiss:
            return None
        except AdmissionRefused as exc:
            self.count_gate_refusal(exc)
            return exc
        # Counted as queued until its admission runs, so frames arriving meanwhile are refused right here.
        self.pending = load.note_pending(model_name=model_name, priority=self.user.tier.queue_priority)
        return None

    def service_call(self, service):
        """``service`` (a reply-creating service, usually wrapped by :meth:`admitting`) as an awaitable
        database call on :func:`reply_service_pool`'s threads, its connections closed before it returns."""
        return db_call(service, thread_sensitive=False, executor=reply_service_pool())

    def admitting(self, service, *, check_session: bool = False):
        """``service`` (a reply-creating service) that first stops counting this frame's pending request, on
        the database thread right before its own admission counts it (see :meth:`refusal_from_memory`), and
        runs it inside ``admission.gate_passed`` for the model the gate let it through to; the frame's end
        clears the pending request too, should the call never run. ``check_session``: first check, on the
        same thread, that the socket's session is current, raising :class:`SessionEnded` (nothing stored)
        when it is not: the frame's session check and its service in one hop instead of two."""
        token = self.pending
        session_key, user_id = self.session_key, self.user.pk

        @functools.wraps(service)
        def call(**kwargs):
            if check_session and not session_is_current(session_key=session_key, user_id=user_id):
                load.clear_pending(token)
                raise SessionEnded
            # The model the cached gate let this frame through to: its load decision stands.
            with admission.gate_passed(load.clear_pending(token)):
                return service(**kwargs)

        return call

    async def refresh_tier(self):
        """Admit with the user's current tier, not the one loaded when the socket connected (an admin's
        change or an approved upgrade applies within ``ADMISSION_LOAD_CACHE_S``): from the cache on the
        event loop, else on a worker thread."""
        try:
            with load.cached_only():
                admission.refresh_tier(self.user)
            return
        except load.CacheMiss:
            pass
        await db_call(admission.refresh_tier, thread_sensitive=False)(self.user)

    async def admission_gate(self, model: str | None = None):
        # Refuse under overload (or a model the plan does not offer) in milliseconds: from the 1 s cache
        # right here on the event loop, else on a worker thread (thread_sensitive=False: not queued behind
        # other clients' database work). A conversation's remembered model is checked in the service.
        try:
            try:
                with load.cached_only():
                    admission.load_gate_for_user(user=self.user, model_name=model or "")
                return
            except load.CacheMiss:
                pass
            await db_call(admission.load_gate_for_user, thread_sensitive=False)(
                user=self.user, model_name=model or ""
            )
        except AdmissionRefused as exc:
            self.count_gate_refusal(exc)
            raise

    def count_gate_refusal(self, exc: AdmissionRefused) -> None:
        """Count a refusal decided at this consumer's gate as the service counts its own
        (``admission_rejections_total`` by tier and reason, and the staff page's per-minute counts), with no
        Redis round trip on the event loop (:func:`conversations.refusals.refusal_note`)."""
        tier = self.user.tier.name
        metrics.observe_admission(tier=tier, refused_code=exc.code)
        refusals.refusal_note(tier=tier, reason=exc.code)
