"""Chat pages: the page itself (new or existing conversation), rename and delete."""

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from conversations import selectors, services


def home(request):
    """``/``: the chat for a signed-in user, the log-in page otherwise."""
    return redirect("conversations:new" if request.user.is_authenticated else "accounts:login")


def _render_chat(request, conversation):
    context = {
        "conversations": selectors.conversation_page_for_user(
            user=request.user, page_number=request.GET.get("page")
        ),
        "conversation": conversation,
        "chat_messages": selectors.message_list(conversation=conversation) if conversation else [],
        "ws_path": "/ws/chat/",
        "max_message_chars": settings.MAX_MESSAGE_CHARS,
    }
    return render(request, "chat/chat.html", context)


@login_required
def chat_new(request):
    """An empty chat; the first ``send`` over the WebSocket creates the conversation."""
    return _render_chat(request, None)


@login_required
def chat_detail(request, conversation_id: int):
    """One of the user's conversations (404 for anyone else's)."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    return _render_chat(request, conversation)


@login_required
@require_POST
def chat_rename(request, conversation_id: int):
    """POST ``title``; an empty title leaves the old one and says why."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    try:
        services.conversation_rename(conversation=conversation, title=request.POST.get("title", ""))
    except ValueError as exc:
        flash.error(request, f"Not renamed: {exc}.")
    return redirect("conversations:detail", conversation_id=conversation.id)


@login_required
@require_POST
def chat_delete(request, conversation_id: int):
    """POST only (the page confirms first); deletes the conversation and its messages."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    services.conversation_delete(conversation=conversation)
    flash.success(request, "Conversation deleted.")
    return redirect("conversations:new")
