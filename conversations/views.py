"""Chat pages: the page itself (new or existing conversation, the active branch), older messages on
scroll, branch switching, rename, delete and the conversation's system prompt."""

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from billing.selectors import tier_backoff
from conversations import branches, recall, selectors, services, sharing, token_budget
from documents import selectors as document_selectors
from documents.progress import document_dict
from events import broadcast
from inference.registry import models_for_tier
from memory.selectors import conversation_memory_enabled
from memory.services import conversation_memory_set


def _with_citations(messages):
    """Set ``cited`` (the reply's citation chips, ``documents.selectors.citations_for_messages``) on each
    message; returns ``messages``."""
    cited = document_selectors.citations_for_messages(message_ids=[m.id for m in messages])
    for m in messages:
        m.cited = cited.get(m.id, [])
    return messages


def home(request):
    """``/``: the chat for a signed-in user, the log-in page otherwise."""
    return redirect("conversations:new" if request.user.is_authenticated else "accounts:login")


def _wants_json(request) -> bool:
    return request.headers.get("Accept", "").startswith("application/json")


def _render_chat(request, conversation, *, focus_message_id=None):
    tier = request.user.tier
    tier_models = models_for_tier(tier)
    path = (
        branches.active_path(
            conversation=conversation,
            # Opening at a search hit loads the whole branch so the page can scroll to it.
            limit=None if focus_message_id else branches.PATH_PAGE_SIZE,
        )
        if conversation
        else branches.PathPage(messages=[], has_older=False)
    )
    recall.attach_recalls(user=request.user, messages=path.messages)
    context = {
        "conversations": selectors.conversation_page_for_user(
            user=request.user, page_number=request.GET.get("page")
        ),
        "conversation": conversation,
        "chat_messages": _with_citations(path.messages),
        "has_older": path.has_older,
        "focus_message_id": focus_message_id,
        "ws_path": "/ws/chat/",
        "max_message_chars": settings.MAX_MESSAGE_CHARS,
        "prompt_budget_tokens": token_budget.prompt_budget_tokens(tier=tier),
        "tier_models": tier_models,
        # The model picked for this conversation ("" = the tier's routing); a choice the tier no longer
        # offers shows as "" (generations._chosen_model treats it the same way).
        "chosen_model": conversation.model_name
        if conversation and conversation.model_name in tier_models
        else "",
        "page_config": {
            "backoff": tier_backoff(tier=tier),
            "maxChars": settings.MAX_MESSAGE_CHARS,
        },
        "shares": sharing.shares_for_conversation(conversation=conversation) if conversation else [],
        "documents": [
            document_dict(d) for d in document_selectors.document_list(conversation_id=conversation.id)
        ]
        if conversation
        else [],
        "documents_max_bytes": settings.DOCUMENTS_MAX_BYTES,
        "documents_max_mib": f"{settings.DOCUMENTS_MAX_BYTES / (1024 * 1024):g}",
        "conversation_memory": conversation_memory_enabled(conversation_id=conversation.id)
        if conversation
        else True,
    }
    return render(request, "chat/chat.html", context)


@login_required
def chat_new(request):
    """An empty chat; the first ``send`` over the WebSocket creates the conversation."""
    return _render_chat(request, None)


@login_required
def chat_detail(request, conversation_id: int):
    """One of the user's conversations (404 for anyone else's). ``?m=<message id>`` opens it at that
    message (a search hit), switching to the branch that holds it."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    focus = None
    if request.GET.get("m"):
        message = selectors.message_get_for_user(user=request.user, message_id=request.GET["m"])
        if message.conversation_id != conversation.id:
            raise Http404("message not in this conversation")
        path_ids = {m.id for m in branches.active_path(conversation=conversation).messages}
        if message.id not in path_ids:
            branches.branch_switch(conversation=conversation, message=message)
        focus = message.id
    return _render_chat(request, conversation, focus_message_id=focus)


@login_required
@require_GET
def chat_messages(request, conversation_id: int):
    """HTML of the active branch: ``?before=<id>`` the page of older messages above that one (scroll
    back), otherwise the newest page (a tab re-syncing). Header ``X-Has-Older: 1|0``."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    before = None
    if request.GET.get("before"):
        before = selectors.message_get_for_user(user=request.user, message_id=request.GET["before"])
        if before.conversation_id != conversation.id:
            raise Http404("message not in this conversation")
    path = branches.active_path(conversation=conversation, before=before, limit=branches.PATH_PAGE_SIZE)
    recall.attach_recalls(user=request.user, messages=path.messages)
    response = render(request, "chat/_messages.html", {"chat_messages": _with_citations(path.messages)})
    response["X-Has-Older"] = "1" if path.has_older else "0"
    return response


@login_required
@require_POST
def chat_branch(request, conversation_id: int):
    """POST ``message_id``: show the branch through that message (a sibling picked with ‹ ›). Answers the
    newest page of the new active branch as HTML, like :func:`chat_messages`; other tabs are told."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    message = selectors.message_get_for_user(user=request.user, message_id=request.POST.get("message_id"))
    if message.conversation_id != conversation.id:
        raise Http404("message not in this conversation")
    branches.branch_switch(conversation=conversation, message=message)
    broadcast.publish_to_user_on_commit(
        request.user.pk,
        broadcast.frame_conversation(
            kind="messages", conversation_id=conversation.id, title=conversation.title
        ),
    )
    path = branches.active_path(conversation=conversation, limit=branches.PATH_PAGE_SIZE)
    recall.attach_recalls(user=request.user, messages=path.messages)
    response = render(request, "chat/_messages.html", {"chat_messages": _with_citations(path.messages)})
    response["X-Has-Older"] = "1" if path.has_older else "0"
    return response


@login_required
@require_POST
def chat_rename(request, conversation_id: int):
    """POST ``title``; an empty title leaves the old one and says why. JSON for the page's script."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    try:
        services.conversation_rename(conversation=conversation, title=request.POST.get("title", ""))
    except ValueError as exc:
        if _wants_json(request):
            return JsonResponse({"error": f"Not renamed: {exc}."}, status=400)
        flash.error(request, f"Not renamed: {exc}.")
    else:
        broadcast.publish_to_user_on_commit(
            request.user.pk,
            broadcast.frame_conversation(
                kind="renamed", conversation_id=conversation.id, title=conversation.title
            ),
        )
        if _wants_json(request):
            return JsonResponse({"id": conversation.id, "title": conversation.title})
    return redirect("conversations:detail", conversation_id=conversation.id)


@login_required
@require_POST
def chat_delete(request, conversation_id: int):
    """POST only (the page confirms first); deletes the conversation and its messages. JSON for the page's
    script (which stays on the conversation it shows); otherwise back to the chat the person came from."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    services.conversation_delete(conversation=conversation)
    broadcast.publish_to_user_on_commit(
        request.user.pk, broadcast.frame_conversation(kind="deleted", conversation_id=conversation_id)
    )
    if _wants_json(request):
        return JsonResponse({"id": conversation_id, "deleted": True})
    flash.success(request, "Conversation deleted.")
    return redirect("conversations:new")


@login_required
@require_POST
def chat_system_prompt(request, conversation_id: int):
    """POST ``system_prompt``: replace this conversation's system prompt (applies to later replies)."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    try:
        services.conversation_set_system_prompt(
            conversation=conversation, system_prompt=request.POST.get("system_prompt", "")
        )
    except ValueError as exc:
        flash.error(request, f"System prompt not saved: {exc}.")
    else:
        flash.success(request, "System prompt saved; it applies to the next replies.")
    return redirect("conversations:detail", conversation_id=conversation.id)


@login_required
@require_POST
def chat_memory(request, conversation_id: int):
    """POST ``enabled`` = "on" | "off": let memory use this conversation, or keep it out (off also forgets
    what memory had kept of it)."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    enabled = request.POST.get("enabled") == "on"
    conversation_memory_set(user_id=request.user.pk, conversation_id=conversation.id, enabled=enabled)
    flash.success(
        request,
        "Memory may use this conversation." if enabled else "This conversation is kept out of memory.",
    )
    return redirect("conversations:detail", conversation_id=conversation.id)
