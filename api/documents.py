"""Documents in the history API (``/api/...``, django-ninja): upload a file to a conversation with an API
key, list a conversation's files, read one's processing state, delete one. Each conversation is reached
through ``conversation_get_for_user`` and each document through ``document_get_for_user`` (404 for anyone
else's).

Upload takes ``Authorization: Bearer cs-...`` only: a browser session's CSRF check would read the whole
body before the size cap is in place (the page has its own upload view for that reason)."""

from datetime import datetime
from typing import Annotated

from django.conf import settings
from django.http import HttpResponse
from ninja import Path, Schema, Status

from api.auth import ApiKeyBearer
from api.history import ERRORS, MAX_ID, ConversationId, history_api
from conversations.selectors import conversation_get_for_user
from database.connections import closes_connections
from documents import selectors as document_selectors
from documents import services as document_services
from documents.parsing import DocumentRejected
from documents.progress import document_dict
from documents.uploads import status_for, upload_limit, upload_take


class DocumentOut(Schema):
    id: int
    conversation_id: int
    name: str
    kind: str
    content_type: str
    size_bytes: int
    pages: int | None
    status: str
    stage: str
    progress: float
    chunk_count: int
    error: str
    created_at: datetime


class DocumentList(Schema):
    items: list[DocumentOut]


class Refusal(Schema):
    detail: str
    code: str = ""  # absent from the 400 of chatsite.input_guard (a form field PostgreSQL cannot store)


DocumentId = Annotated[int, Path(ge=1, le=MAX_ID)]


def _refusal(rejected: DocumentRejected) -> Status:
    return Status(status_for(rejected), {"detail": str(rejected), "code": rejected.code})


@history_api.post(
    "/conversations/{conversation_id}/documents",
    auth=ApiKeyBearer(),
    response={201: DocumentOut, **ERRORS, 400: Refusal, 409: Refusal, 413: Refusal, 415: Refusal},
    summary="Add a file (PDF, DOCX, text, Markdown) to a conversation",
    description=(
        "multipart/form-data with one file in field `file`. The type is recognised by content. The file is "
        "then processed in the background (`status`: processing -> ready | failed); poll "
        "`GET /api/documents/{id}`. Limits: DOCUMENTS_MAX_BYTES, DOCUMENTS_MAX_PAGES, "
        "DOCUMENTS_MAX_PER_CONVERSATION."
    ),
)
@closes_connections
def upload_document(request, conversation_id: ConversationId):
    try:
        upload_limit(request, max_bytes=settings.DOCUMENTS_MAX_BYTES)
        conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
        upload = upload_take(request, max_bytes=settings.DOCUMENTS_MAX_BYTES)
        document = document_services.document_add(
            user=request.user, conversation=conversation, name=upload.name, data=upload.data
        )
    except DocumentRejected as rejected:
        return _refusal(rejected)
    return Status(201, document_dict(document))


@history_api.get(
    "/conversations/{conversation_id}/documents",
    response={200: DocumentList, **ERRORS},
    summary="List a conversation's files",
)
@closes_connections
def list_documents(request, conversation_id: ConversationId):
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    return {
        "items": [document_dict(d) for d in document_selectors.document_list(conversation_id=conversation.id)]
    }


@history_api.get(
    "/documents/{document_id}",
    response={200: DocumentOut, **ERRORS},
    summary="A file and its processing state",
)
@closes_connections
def get_document(request, document_id: DocumentId):
    return document_dict(document_selectors.document_get_for_user(user=request.user, document_id=document_id))


@history_api.delete(
    "/documents/{document_id}", response={204: None, **ERRORS}, summary="Delete a file and its chunks"
)
@closes_connections
def delete_document(request, document_id: DocumentId):
    document = document_selectors.document_get_for_user(user=request.user, document_id=document_id)
    document_services.document_delete(document=document)
    return HttpResponse(status=204)
