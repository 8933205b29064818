"""The history JSON API (``/api/...``) with django-ninja, which also publishes its OpenAPI document at
``/api/openapi.json`` (interactive docs at ``/api/docs``). Signed-in browser sessions (CSRF-checked for
writes) and API keys (``Authorization: Bearer cs-...``) both work. Every conversation is reached through
``conversation_get_for_user``, so another user's conversation answers 404."""

from datetime import datetime

from django.http import HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.security import django_auth

from api.auth import ApiKeyBearer
from conversations.selectors import conversation_get_for_user, conversation_page_for_user, message_page
from conversations.services import conversation_delete, conversation_rename
from database.connections import closes_connections

MAX_PER_PAGE = 100

history_api = NinjaAPI(
    title="chatsite history API",
    version="1",
    description="Your conversations and their messages. Authenticate with a browser session or an API key.",
    auth=[ApiKeyBearer(), django_auth],
    urls_namespace="history_api",
)


class ConversationOut(Schema):
    id: int
    title: str
    created_at: datetime
    updated_at: datetime


class ConversationPage(Schema):
    count: int
    page: int
    pages: int
    items: list[ConversationOut]


class MessageOut(Schema):
    id: int
    role: str
    content: str
    status: str
    model_name: str
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_ms: int | None
    created_at: datetime


class MessagePage(Schema):
    count: int
    page: int
    pages: int
    items: list[MessageOut]


class ConversationDetail(ConversationOut):
    system_prompt: str
    messages: MessagePage


class RenameIn(Schema):
    title: str


def _per_page(per_page: int) -> int:
    return max(1, min(per_page, MAX_PER_PAGE))


def _page_out(page) -> dict:
    return {
        "count": page.paginator.count,
        "page": page.number,
        "pages": page.paginator.num_pages,
        "items": list(page.object_list),
    }


@history_api.get("/conversations", response=ConversationPage, summary="List conversations, newest first")
@closes_connections
def list_conversations(request, page: int = 1, per_page: int = 30):
    return _page_out(
        conversation_page_for_user(user=request.user, page_number=page, per_page=_per_page(per_page))
    )


@history_api.get(
    "/conversations/{conversation_id}",
    response=ConversationDetail,
    summary="A conversation with its messages",
)
@closes_connections
def get_conversation(request, conversation_id: int, page: int = 1, per_page: int = 50):
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    messages = message_page(conversation=conversation, page_number=page, per_page=_per_page(per_page))
    return {
        "id": conversation.id,
        "title": conversation.title,
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "system_prompt": conversation.system_prompt,
        "messages": _page_out(messages),
    }


@history_api.patch(
    "/conversations/{conversation_id}", response=ConversationOut, summary="Rename a conversation"
)
@closes_connections
def rename_conversation(request, conversation_id: int, payload: RenameIn):
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    try:
        return conversation_rename(conversation=conversation, title=payload.title)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from exc


@history_api.delete("/conversations/{conversation_id}", response={204: None}, summary="Delete a conversation")
@closes_connections
def delete_conversation(request, conversation_id: int):
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    conversation_delete(conversation=conversation)
    return HttpResponse(status=204)
