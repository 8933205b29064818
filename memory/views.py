"""The memory page (``/memory/``): the account's switch, its key facts (add, edit, delete) and a button
that forgets every remembered conversation turn; and the "forget" button of a recalled chunk. Thin: call
selectors and services, render or redirect."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from memory import selectors, services
from memory.models import Chunk, Memory


def _page(request, *, error: str = "", status: int = 200):
    user_id = request.user.pk
    turns = Chunk.objects.filter(user_id=user_id, source_kind=Chunk.Source.TURN).aggregate(
        chunks=Count("id"), conversations=Count("conversation", distinct=True)
    )
    context = {
        "enabled": selectors.account_memory_enabled(user_id=user_id),
        "memories": selectors.memories_for_user(user_id=user_id),
        "turn_chunks": turns["chunks"],
        "turn_conversations": turns["conversations"],
        "max_chars": Memory.MAX_CHARS,
        "error": error,
    }
    return render(request, "memory/memory.html", context, status=status)


@login_required
def memory_page(request):
    """What chatsite remembers for this account, and the controls over it."""
    return _page(request)


@login_required
@require_POST
def account_switch(request):
    """POST ``enabled`` = "on" | "off"."""
    enabled = request.POST.get("enabled") == "on"
    services.account_memory_set(user_id=request.user.pk, enabled=enabled)
    messages.success(
        request, "Memory is on." if enabled else "Memory is off: nothing new is remembered or recalled."
    )
    return redirect("memory:page")


@login_required
@require_POST
def memory_add(request):
    """POST ``text``: a new key fact (1..500 characters)."""
    try:
        services.memory_create(user_id=request.user.pk, text=request.POST.get("text", ""))
    except services.MemoryInvalid as exc:
        return _page(request, error=str(exc), status=400)
    return redirect("memory:page")


@login_required
@require_POST
def memory_edit(request, memory_id: int):
    """POST ``text``: replace a key fact's text; 404 for another user's."""
    try:
        services.memory_update(
            user_id=request.user.pk, memory_id=memory_id, text=request.POST.get("text", "")
        )
    except Memory.DoesNotExist as exc:
        raise Http404("no such memory") from exc
    except services.MemoryInvalid as exc:
        return _page(request, error=str(exc), status=400)
    return redirect("memory:page")


@login_required
@require_POST
def memory_delete(request, memory_id: int):
    try:
        services.memory_delete(user_id=request.user.pk, memory_id=memory_id)
    except Memory.DoesNotExist as exc:
        raise Http404("no such memory") from exc
    return redirect("memory:page")


@login_required
@require_POST
def forget_all(request):
    """Delete every remembered conversation turn (chunks and vectors); key facts stay."""
    count = services.chunks_forget_all(user_id=request.user.pk)
    messages.success(request, f"Forgot {count} remembered passages.")
    return redirect("memory:page")


@login_required
@require_POST
def chunk_forget(request, chunk_id: int):
    """Forget one recalled passage; back to ``next`` (a local URL) or the memory page. 404 when not the
    user's."""
    try:
        services.chunk_forget(user_id=request.user.pk, chunk_id=chunk_id)
    except Chunk.DoesNotExist as exc:
        raise Http404("no such passage") from exc
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = ""
    messages.success(request, "Forgotten: it will not be recalled again.")
    return redirect(target or "memory:page")
