"""The history JSON API (``/api/...``) with django-ninja, which also publishes its OpenAPI document at
``/api/openapi.json`` (interactive docs at ``/api/docs``). Signed-in browser sessions (CSRF-checked for
writes) and API keys (``Authorization: Bearer cs-...``) both work. Every conversation is reached through
``conversation_get_for_user``, so another user's conversation answers 404."""

from datetime import datetime
from typing import Annotated, Any

from django.http import HttpResponse
from ninja import NinjaAPI, Path, Schema
from ninja.errors import HttpError
from ninja.security import django_auth
from pydantic import model_validator

from api.auth import ApiKeyBearer
from conversations.selectors import conversation_get_for_user, conversation_page_for_user, message_page
from conversations.services import conversation_delete, conversation_rename
from database.connections import closes_connections

MAX_PER_PAGE = 100
#: Ids are PostgreSQL ``bigint`` keys; a larger number is a 422, not a database error.
MAX_ID = 2**63 - 1

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

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        # django-ninja's Schema reads fields as attributes, so a bare JSON string would pass as its own
        # ``str.title()`` (found by schemathesis): the body must be an object.
        if not isinstance(getattr(data, "_obj", data), dict):  # ninja hands a DjangoGetter around the body
            raise ValueError("the body must be a JSON object")
        return data


class ErrorOut(Schema):
    """``{"detail": "..."}``: 400 (refused input, e.g. an empty title or text PostgreSQL cannot store), 401
    (no or a wrong API key / session), 404 (no such conversation, or someone else's), 503 (the database is
    briefly unavailable; retry after ``Retry-After`` seconds)."""

    detail: str


class ValidationErrorOut(Schema):
    """``{"detail": [{"type", "loc", "msg", ...}]}``: 422, a parameter or body of the wrong type or range."""

    detail: list[dict[str, Any]]


#: Error answers every operation declares (django-ninja's shapes; 400 also from chatsite.input_guard, 503
#: with Retry-After from chatsite.outage_pages while the database is unreachable).
ERRORS = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 422: ValidationErrorOut, 503: ErrorOut}
ConversationId = Annotated[int, Path(ge=1, le=MAX_ID)]


def _per_page(per_page: int) -> int:
    return max(1, min(per_page, MAX_PER_PAGE))


def _page_out(page) -> dict:
    return {
        "count": page.paginator.count,
        "page": page.number,
        "pages": page.paginator.num_pages,
        "items": list(page.object_list),
    }


@history_api.get(
    "/conversations", response={200: ConversationPage, **ERRORS}, summary="List conversations, newest first"
)
@closes_connections
def list_conversations(request, page: int = 1, per_page: int = 30):
    return _page_out(
        conversation_page_for_user(user=request.user, page_number=page, per_page=_per_page(per_page))
    )


@history_api.get(
    "/conversations/{conversation_id}",
    response={200: ConversationDetail, **ERRORS},
    summary="A conversation with its messages",
)
@closes_connections
def get_conversation(
    request,
    conversation_id: ConversationId,
    page: int = 1,
    per_page: int = 50,
):
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
    "/conversations/{conversation_id}",
    response={200: ConversationOut, **ERRORS},
    summary="Rename a conversation",
)
@closes_connections
def rename_conversation(request, conversation_id: ConversationId, payload: RenameIn):
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    try:
        return conversation_rename(conversation=conversation, title=payload.title)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from exc


@history_api.delete(
    "/conversations/{conversation_id}", response={204: None, **ERRORS}, summary="Delete a conversation"
)
@closes_connections
def delete_conversation(request, conversation_id: ConversationId):
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    conversation_delete(conversation=conversation)
    return HttpResponse(status=204)
