"""Documents on the chat page (JSON for static/chat/documents.js): upload a file to a conversation (or to a
new chat, which it starts), list a conversation's files, delete one. Thin: the conversation is reached
through ``conversation_get_for_user``; the checks, storage and processing are ``documents.services``'."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_POST

from conversations import selectors, services
from documents import selectors as document_selectors
from documents import services as document_services
from documents.parsing import DocumentRejected
from documents.progress import document_dict
from documents.uploads import status_for, upload_limit, upload_take
from events import broadcast


def _refused(rejected: DocumentRejected) -> JsonResponse:
    return JsonResponse({"error": str(rejected), "code": rejected.code}, status=status_for(rejected))


@csrf_exempt
@require_POST
def document_upload(request, conversation_id: int | None = None):
    """POST multipart ``file`` (CSRF token in the ``X-CSRFToken`` header): add it to the conversation, or
    without ``conversation_id`` start a new chat titled after the file. 201 ``{"document", "conversation"}``;
    a refused file answers 4xx ``{"error", "code"}`` (413 too large, 415 not a PDF/DOCX/text file, 409 too
    many files, 400 otherwise) and nothing is stored.

    CSRF-exempt only until the upload cap is in place: reading the body (which the CSRF check does) must
    come after it (Django's upload-handler docs)."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": "Sign in to add files.", "code": "unauthenticated"}, status=401)
    try:
        upload_limit(request, max_bytes=settings.DOCUMENTS_MAX_BYTES)
    except DocumentRejected as rejected:
        return _refused(rejected)
    return _document_upload(request, conversation_id)


@csrf_protect
def _document_upload(request, conversation_id: int | None):
    try:
        upload = upload_take(request, max_bytes=settings.DOCUMENTS_MAX_BYTES)
        with transaction.atomic():
            if conversation_id is None:
                name = document_services.clean_name(upload.name)
                conversation = services.conversation_create(owner=request.user, title=name)
            else:
                conversation = selectors.conversation_get_for_user(
                    user=request.user, conversation_id=conversation_id
                )
            document = document_services.document_add(
                user=request.user, conversation=conversation, name=upload.name, data=upload.data
            )
            if conversation_id is None:  # the other tabs list the new chat
                broadcast.publish_to_user_on_commit(
                    request.user.pk,
                    broadcast.frame_conversation(
                        kind="messages", conversation_id=conversation.id, title=conversation.title
                    ),
                )
    except DocumentRejected as rejected:
        return _refused(rejected)
    except selectors.ConversationNotFound:
        return JsonResponse({"error": "Conversation not found.", "code": "not_found"}, status=404)
    return JsonResponse(
        {
            "document": document_dict(document),
            "conversation": {"id": conversation.id, "title": conversation.title},
        },
        status=201,
    )


@login_required
@require_GET
def document_list(request, conversation_id: int):
    """``{"documents": [...]}``: the conversation's files with their processing state."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    documents = document_selectors.document_list(conversation_id=conversation.id)
    return JsonResponse({"documents": [document_dict(d) for d in documents]})


@login_required
@require_POST
def document_delete(request, document_id: int):
    """Delete one of the user's files with its chunks and vectors (404 for anyone else's)."""
    document = document_selectors.document_get_for_user(user=request.user, document_id=document_id)
    document_services.document_delete(document=document)
    return JsonResponse({"id": document_id, "deleted": True})


@login_required
@require_GET
def passage(request, chunk_id: int):
    """A cited passage of one of the user's files (a citation chip opens it): ``{"chunk_id", "document_id",
    "name", "page", "ordinal", "text"}``; 404 for anyone else's or a removed file's."""
    return JsonResponse(document_selectors.passage_get_for_user(user=request.user, chunk_id=chunk_id))
