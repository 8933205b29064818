"""Export (JSON, Markdown) and import (chatsite JSON, ChatGPT ``conversations.json``) pages."""

import json

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from conversations import archive, selectors
from conversations.models import Conversation
from memory.selectors import memory_export


def _download(body: str, filename: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _export(conversations, *, fmt: str, stem: str, memory: dict | None = None) -> HttpResponse:
    if fmt == "md":
        return _download(
            archive.export_markdown(conversations=conversations), f"{stem}.md", "text/markdown; charset=utf-8"
        )
    document = archive.export_json(conversations=conversations)
    if memory is not None:
        document["memory"] = memory  # key facts and the memory switch (docs/memory.md)
    body = json.dumps(document, ensure_ascii=False, indent=1)
    return _download(body, f"{stem}.json", "application/json; charset=utf-8")


@login_required
def export_one(request, conversation_id: int):
    """GET ``?format=json|md``: one conversation as a download."""
    conversation = selectors.conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    return _export([conversation], fmt=request.GET.get("format", "json"), stem=f"chatsite-{conversation.id}")


@login_required
def export_all(request):
    """GET ``?format=json|md``: every conversation of the user as one download."""
    conversations = Conversation.objects.filter(owner=request.user, stored=True).order_by("created_at", "id")
    stamp = timezone.now().strftime("%Y%m%d")
    return _export(
        conversations,
        fmt=request.GET.get("format", "json"),
        stem=f"chatsite-export-{stamp}",
        memory=memory_export(user_id=request.user.pk),
    )


@login_required
@require_http_methods(["GET", "POST"])
def import_page(request):
    """GET: the export/import page. POST ``file``: import it, all or nothing, and say what happened."""
    error = None
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            error = "Choose a file to import."
        elif upload.size > archive.settings.IMPORT_MAX_BYTES:
            error = (
                f"The file is {upload.size // 1024} KiB; imports are limited to "
                f"{archive.settings.IMPORT_MAX_BYTES // 1024} KiB."
            )
        else:
            try:
                imported = archive.import_conversations(owner=request.user, data=upload.read())
            except archive.ImportRejected as exc:
                error = f"Nothing was imported: {exc}"
            else:
                n = len(imported)
                flash.success(request, f"Imported {n} conversation{'s' if n != 1 else ''}.")
                if n == 1:
                    return redirect("conversations:detail", conversation_id=imported[0].id)
                return redirect("conversations:new")
    return render(request, "chat/import.html", {"error": error}, status=400 if error else 200)
