"""Processing uploaded files with the real packaged embedding model (all-MiniLM-L6-v2, run in this process as
the embeddings worker runs it): chunks with overlap per page, vectors in memory's store, progress frames, a
file that fails leaving nothing indexed, retrieval scoped to the asking user's conversation, citations on
the page, and deletes that take chunks and vectors along."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.urls import reverse

from accounts.services import account_delete
from conversations import services
from conversations.models import Message
from devtools.document_files import make_docx, make_pdf
from documents.models import Citation, Document
from documents.processing import document_process
from documents.retrieval import DOCUMENTS_MARKER, citations_record, documents_context
from documents.services import document_add, document_delete
from events import broadcast
from memory.models import Chunk
from memory.store import store_for

pytestmark = pytest.mark.django_db

LONG = (
    "The harbour office sells tickets for every crossing. Boats to the northern islands leave on the hour "
    "from the east quay, and the timetable changes in winter when storms close the strait. "
) * 8
FERRY = (
    "The ferry to Tavira island leaves from pier three at 9:40 every morning; the last boat back is at 19:15."
)


@pytest.fixture(autouse=True)
def documents_root(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "documents": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "documents"), "base_url": None},
        },
    }
    return tmp_path / "documents"


def count_tokens(text: str) -> int:
    return len(text.split())


def add_and_process(user, conversation, name, data, embedder, **kwargs):
    document = document_add(user=user, conversation=conversation, name=name, data=data)
    status = document_process(document_id=document.id, encode=kwargs.get("encode", embedder.encode))
    document.refresh_from_db()
    return document, status


def ask(embedder, *, user, conversation, question, k=4):
    return documents_context(
        user_id=user.pk,
        conversation_id=conversation.id,
        question=question,
        budget_tokens=2000,
        count_tokens=count_tokens,
        vector=embedder.encode([question])[0],
        k=k,
        min_score=0.2,
    )


def test_pdf_is_chunked_per_page_with_overlap_embedded_and_indexed(alice, embedder):
    chat = services.conversation_create(owner=alice, title="Trip")
    pdf = make_pdf([LONG, FERRY, ""])
    document, status = add_and_process(alice, chat, "trip.pdf", pdf, embedder)
    assert status == "ready" and document.status == "ready" and document.error == ""
    chunks = list(Chunk.objects.filter(source_kind="document", source_id=document.id).order_by("ordinal"))
    assert document.chunk_count == len(chunks) >= 3
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert {c.meta["page"] for c in chunks} == {1, 2}  # the empty third page has no passage
    assert all(c.user_id == alice.pk and c.conversation_id == chat.id for c in chunks)
    page1 = [c for c in chunks if c.meta["page"] == 1]
    # Overlap: each chunk of a page starts before the previous one ended.
    assert len(page1) >= 2 and all(b.char_start < a.char_end for a, b in zip(page1, page1[1:], strict=False))
    assert all(c.token_count <= 128 for c in chunks)
    assert store_for().size(user_id=alice.pk) == len(chunks)
    assert not Chunk.objects.filter(source_id=document.id, embedding__isnull=True).exists()
    assert document.process_ms is not None and document.stage == ""


def test_docx_and_markdown_are_indexed_without_pages(alice, embedder):
    chat = services.conversation_create(owner=alice, title="Mixed")
    docx, _ = add_and_process(alice, chat, "r.docx", make_docx([FERRY], table=[["a", "b"]]), embedder)
    md, _ = add_and_process(alice, chat, "n.md", b"# Notes\n\n" + LONG.encode(), embedder)
    for document in (docx, md):
        assert document.status == "ready"
        assert all(c.meta == {} for c in Chunk.objects.filter(source_id=document.id, source_kind="document"))


def test_progress_frames_go_to_the_owners_tabs(
    alice, embedder, redis_clean, django_capture_on_commit_callbacks
):
    layer = get_channel_layer()

    def upload_and_process():
        chat = services.conversation_create(owner=alice, title="Trip")
        with django_capture_on_commit_callbacks(execute=True):
            document = document_add(
                user=alice, conversation=chat, name="trip.pdf", data=make_pdf([LONG, FERRY])
            )
        with django_capture_on_commit_callbacks(execute=True):
            document_process(document_id=document.id, encode=embedder.encode)

    async def listen_while_processing() -> list[dict]:
        # One event loop throughout, as a daphne process has: the pub/sub channel layer subscribes per loop.
        import asyncio

        channel = await layer.new_channel("test.")
        await layer.group_add(broadcast.user_group(alice.pk), channel)
        await sync_to_async(upload_and_process)()
        frames = []
        while True:
            try:
                async with asyncio.timeout(0.5):
                    frames.append((await layer.receive(channel))["frame"])
            except TimeoutError:
                return frames

    frames = async_to_sync(listen_while_processing)()
    states = [(f["document"]["status"], f["document"]["stage"]) for f in frames if f["type"] == "document"]
    assert states[0] == ("processing", "queued")  # the upload's own frame
    assert ("processing", "extracting") in states and ("processing", "embedding") in states
    assert states[-1] == ("ready", "")
    extracting = [f["document"] for f in frames if f["document"]["stage"] == "extracting"]
    assert extracting[-1]["progress_done"] == extracting[-1]["progress_total"] == 2


def test_a_file_that_fails_leaves_nothing_indexed_and_says_why(
    alice, embedder, documents_root, settings, django_capture_on_commit_callbacks
):
    chat = services.conversation_create(owner=alice, title="Bad files")
    with django_capture_on_commit_callbacks(execute=True):  # the stored bytes go after commit
        scan, status = add_and_process(alice, chat, "scan.pdf", make_pdf(["", ""]), embedder)
    assert status == "failed" and "no text layer" in scan.error
    settings.DOCUMENTS_MAX_TEXT_CHARS = 500
    with django_capture_on_commit_callbacks(execute=True):
        big, _ = add_and_process(alice, chat, "big.txt", LONG.encode(), embedder)
    assert big.status == "failed" and "limited to 500" in big.error
    settings.DOCUMENTS_MAX_TEXT_CHARS = 1_000_000

    # The embedding fails half-way (the model raising, as a worker out of memory would).
    calls = []

    def failing(texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise RuntimeError("model failure")
        return embedder.encode(texts)

    long_pdf = make_pdf([LONG * 12, LONG * 12])  # > 32 chunks: more than one embedding step
    with django_capture_on_commit_callbacks(execute=True):
        half, status = add_and_process(alice, chat, "half.pdf", long_pdf, embedder, encode=failing)
    assert status == "failed" and len(calls) == 2
    assert "internal error" in half.error
    for document in (scan, big, half):
        assert document.file.name == "" and document.chunk_count == 0
    assert not Chunk.objects.filter(user=alice).exists() and store_for().size(user_id=alice.pk) == 0
    assert [p for p in documents_root.rglob("*") if p.is_file()] == []
    # A redelivered task finds the file no longer processing and does nothing.
    assert document_process(document_id=half.id, encode=embedder.encode) == "skipped"


def test_a_file_removed_while_processing_is_not_indexed(alice, embedder):
    chat = services.conversation_create(owner=alice, title="Gone")
    document = document_add(user=alice, conversation=chat, name="a.txt", data=LONG.encode())

    def delete_meanwhile(texts):
        Document.objects.filter(pk=document.pk).delete()
        return embedder.encode(texts)

    assert document_process(document_id=document.id, encode=delete_meanwhile) == "skipped"
    assert not Chunk.objects.filter(user=alice).exists()


def test_retrieval_cites_only_this_users_passages_of_this_conversation(alice, bob, embedder):
    trip = services.conversation_create(owner=alice, title="Trip")
    other = services.conversation_create(owner=alice, title="Other")
    bobs = services.conversation_create(owner=bob, title="Bob's trip")
    mine, _ = add_and_process(alice, trip, "trip.pdf", make_pdf([LONG, FERRY]), embedder)
    add_and_process(
        alice, other, "recipes.txt", b"Bake the bread for forty minutes at 220 degrees.", embedder
    )
    bob_doc, _ = add_and_process(bob, bobs, "bob-trip.pdf", make_pdf([FERRY]), embedder)

    found = ask(embedder, user=alice, conversation=trip, question="When does the ferry to Tavira leave?")
    assert found.text.startswith(DOCUMENTS_MARKER) and "[1] (trip.pdf, page 2)" in found.text
    cited = Chunk.objects.filter(pk__in=[c.chunk_id for c in found.cited])
    assert {(c.user_id, c.source_id) for c in cited} == {(alice.pk, mine.id)}
    assert [c.marker for c in found.cited] == list(range(1, len(found.cited) + 1))
    # Another conversation of the same user: the trip file is not there.
    elsewhere = ask(embedder, user=alice, conversation=other, question="When does the ferry to Tavira leave?")
    assert all(Chunk.objects.get(pk=c.chunk_id).conversation_id == other.id for c in elsewhere.cited)
    # Bob asking in Alice's conversation id still searches only Bob's rows: nothing.
    assert (
        ask(embedder, user=bob, conversation=trip, question="When does the ferry to Tavira leave?").cited
        == []
    )
    bob_found = ask(embedder, user=bob, conversation=bobs, question="When does the ferry to Tavira leave?")
    assert {Chunk.objects.get(pk=c.chunk_id).source_id for c in bob_found.cited} == {bob_doc.id}
    # A chat without ready files asks nothing of the embeddings worker and injects nothing.
    empty = services.conversation_create(owner=alice, title="Empty")
    assert (
        documents_context(
            user_id=alice.pk,
            conversation_id=empty.id,
            question="ferry?",
            budget_tokens=500,
            count_tokens=count_tokens,
        ).text
        == ""
    )


def test_passages_fit_the_token_budget(alice, embedder):
    chat = services.conversation_create(owner=alice, title="Trip")
    add_and_process(alice, chat, "trip.pdf", make_pdf([LONG, FERRY]), embedder)
    small = documents_context(
        user_id=alice.pk,
        conversation_id=chat.id,
        question="ferry to Tavira",
        budget_tokens=60,
        count_tokens=count_tokens,
        vector=embedder.encode(["ferry to Tavira"])[0],
    )
    assert small.cited and count_tokens(small.text) <= 60


def reply_with_citations(user, chat, embedder):
    question = services.message_create(conversation=chat, role="user", content="When does the ferry leave?")
    reply = services.message_create(
        conversation=chat, role="assistant", content="At 9:40 [1].", parent=question
    )
    found = ask(embedder, user=user, conversation=chat, question="When does the ferry to Tavira leave?")
    citations_record(reply_id=reply.id, cited=found.cited)
    return reply


def test_the_page_shows_citation_chips_that_open_the_passage(client, alice, bob, embedder):
    chat = services.conversation_create(owner=alice, title="Trip")
    add_and_process(alice, chat, "trip.pdf", make_pdf([LONG, FERRY]), embedder)
    reply = reply_with_citations(alice, chat, embedder)
    first = Citation.objects.filter(message=reply).order_by("marker").first()
    client.force_login(alice)
    html = client.get(reverse("conversations:detail", args=[chat.id])).content.decode()
    assert 'class="citation-chip"' in html and "[1] trip.pdf · p. 2" in html
    passage = client.get(reverse("conversations:passage", args=[first.chunk_id])).json()
    assert passage["name"] == "trip.pdf" and passage["page"] == 2 and "9:40" in passage["text"]
    client.force_login(bob)
    assert client.get(reverse("conversations:passage", args=[first.chunk_id])).status_code == 404
    # A recalled conversation turn is not a passage of a file.
    turn = Chunk.objects.create(
        user=alice, source_kind="turn", source_id=reply.id, text="hi", conversation=chat
    )
    client.force_login(alice)
    assert client.get(reverse("conversations:passage", args=[turn.pk])).status_code == 404


def test_deleting_a_file_its_conversation_or_the_account_deletes_chunks_vectors_and_citations(
    alice, embedder, django_capture_on_commit_callbacks
):
    trip = services.conversation_create(owner=alice, title="Trip")
    other = services.conversation_create(owner=alice, title="Other")
    first, _ = add_and_process(alice, trip, "trip.pdf", make_pdf([LONG, FERRY]), embedder)
    reply = reply_with_citations(alice, trip, embedder)
    assert Citation.objects.filter(message=reply).exists()
    second, _ = add_and_process(alice, trip, "more.txt", FERRY.encode(), embedder)
    third, _ = add_and_process(alice, other, "other.txt", LONG.encode(), embedder)
    size = store_for().size(user_id=alice.pk)

    with django_capture_on_commit_callbacks(execute=True):
        document_delete(document=first)
    assert not Chunk.objects.filter(source_kind="document", source_id=first.id).exists()
    assert not Citation.objects.exists()
    assert store_for().size(user_id=alice.pk) == size - first.chunk_count

    with django_capture_on_commit_callbacks(execute=True):
        services.conversation_delete(conversation=trip)
    assert not Document.objects.filter(pk=second.pk).exists()
    assert set(Chunk.objects.filter(user=alice).values_list("source_id", flat=True)) == {third.id}
    assert not Message.objects.filter(pk=reply.pk).exists()

    with django_capture_on_commit_callbacks(execute=True):
        account_delete(user=alice)
    assert not Chunk.objects.exists() and store_for().size() == 0 and not Document.objects.exists()
