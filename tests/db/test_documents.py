"""Documents at the database layer: uploads by the page and the API (limits, bad files, nothing stored on a
refusal), the documents storage (local filesystem; S3 through moto's fake), access by owner only, deletes
that take the stored file along, and the export's file names."""

import json
from pathlib import Path

import pytest
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from api.services import api_key_create
from conversations import archive, services
from devtools.document_files import PNG, make_docx, make_pdf
from documents.models import Document
from tests.conftest import broker_take

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def documents_root(settings, tmp_path):
    """Each test stores files in a directory of its own."""
    settings.STORAGES = {
        **settings.STORAGES,
        "documents": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "documents"), "base_url": None},
        },
    }
    yield tmp_path / "documents"


def stored_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def chat(alice):
    return services.conversation_create(owner=alice, title="Reading")


def page_upload(client, conversation, name, data):
    url = (
        reverse("conversations:document_upload", args=[conversation.id])
        if conversation
        else reverse("conversations:document_upload_new")
    )
    return client.post(url, {"file": SimpleUploadedFile(name, data)}, HTTP_ACCEPT="application/json")


def test_page_upload_stores_the_file_and_queues_its_processing(
    client, alice, chat, documents_root, django_capture_on_commit_callbacks, redis_clean
):
    client.force_login(alice)
    pdf = make_pdf(["The ferry leaves at 9:40.", "Lunch at noon."])
    with django_capture_on_commit_callbacks(execute=True):
        response = page_upload(client, chat, "../../etc/Trip plan.pdf", pdf)
    assert response.status_code == 201, response.content
    body = response.json()
    document = Document.objects.get()
    assert body["document"]["id"] == document.id and body["conversation"]["id"] == chat.id
    assert (document.owner, document.conversation, document.name) == (alice, chat, "Trip plan.pdf")
    assert (document.kind, document.pages, document.size_bytes, document.status) == (
        "pdf",
        2,
        len(pdf),
        "processing",
    )
    # Stored under the owner's prefix with a random name, never the uploaded name.
    assert document.file.name.startswith(f"u{alice.pk}/") and document.file.name.endswith(".pdf")
    [path] = stored_files(documents_root)
    assert path.read_bytes() == pdf
    assert [args for args, _ in broker_take("embeddings")] == [[document.id]]


def test_upload_to_a_new_chat_starts_it_titled_after_the_file(client, alice):
    client.force_login(alice)
    response = page_upload(client, None, "notes.md", b"# Notes\n\nBuy milk.\n")
    assert response.status_code == 201
    conversation = alice.conversations.get()
    assert conversation.title == "notes.md"
    assert response.json()["conversation"] == {"id": conversation.id, "title": "notes.md"}
    assert Document.objects.get().kind == "markdown"


@pytest.mark.parametrize(
    "name,data,status,code",
    [
        ("photo.pdf", PNG, 415, "unsupported_type"),  # a renamed binary
        ("notes.txt", bytes(range(256)) * 4, 415, "unsupported_type"),
        ("broken.pdf", b"%PDF-1.7\n" + b"\x00garbage" * 50, 400, "corrupt"),
        ("long.pdf", make_pdf([f"page {i}" for i in range(4)]), 400, "too_many_pages"),
        ("empty.txt", b"", 400, "empty"),
    ],
)
def test_bad_files_are_refused_and_nothing_is_stored(
    client, alice, chat, documents_root, settings, name, data, status, code
):
    settings.DOCUMENTS_MAX_PAGES = 3
    client.force_login(alice)
    response = page_upload(client, chat, name, data)
    assert response.status_code == status
    assert response.json()["code"] == code and response.json()["error"]
    assert not Document.objects.exists()
    assert stored_files(documents_root) == []


def test_oversize_file_is_refused_before_and_while_reading(client, alice, chat, documents_root, settings):
    settings.DOCUMENTS_MAX_BYTES = 2000
    client.force_login(alice)
    # Over the limit by more than the envelope: refused on Content-Length, the body is not read.
    response = page_upload(client, chat, "big.txt", b"a" * 200_000)
    assert response.status_code == 413 and response.json()["code"] == "too_large"
    # Just over the limit: the upload handler stops reading past the limit.
    response = page_upload(client, chat, "big.txt", b"a" * 2001)
    assert response.status_code == 413 and "2000" not in response.json()["error"]
    assert not Document.objects.exists() and stored_files(documents_root) == []
    # At the limit: taken.
    assert page_upload(client, chat, "ok.txt", b"a" * 2000).status_code == 201


def test_refused_file_on_a_new_chat_leaves_no_conversation(client, alice):
    client.force_login(alice)
    response = page_upload(client, None, "photo.docx", PNG)
    assert response.status_code == 415
    assert not alice.conversations.exists()


def test_files_per_conversation_are_limited(client, alice, chat, settings):
    settings.DOCUMENTS_MAX_PER_CONVERSATION = 2
    client.force_login(alice)
    for i in range(2):
        assert page_upload(client, chat, f"{i}.txt", b"some text").status_code == 201
    response = page_upload(client, chat, "3.txt", b"more text")
    assert response.status_code == 409 and response.json()["code"] == "too_many_documents"
    assert Document.objects.count() == 2


def test_page_upload_needs_the_csrf_token(alice, chat):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert page_upload(client, chat, "a.txt", b"text").status_code == 403
    assert not Document.objects.exists()


def test_only_the_owner_reaches_a_conversations_documents(client, alice, bob, chat):
    client.force_login(alice)
    page_upload(client, chat, "mine.txt", b"alice's text")
    document = Document.objects.get()
    client.force_login(bob)
    assert page_upload(client, chat, "theirs.txt", b"bob's text").status_code == 404
    assert client.get(reverse("conversations:documents", args=[chat.id])).status_code == 404
    assert client.post(reverse("conversations:document_delete", args=[document.id])).status_code == 404
    client.logout()
    assert page_upload(client, chat, "anon.txt", b"text").status_code == 401
    assert client.get(reverse("conversations:documents", args=[chat.id])).status_code == 302
    assert Document.objects.count() == 1
    client.force_login(alice)
    listed = client.get(reverse("conversations:documents", args=[chat.id])).json()["documents"]
    assert [d["name"] for d in listed] == ["mine.txt"]


def test_chat_page_lists_the_conversations_files(client, alice, chat):
    client.force_login(alice)
    page_upload(client, chat, "Report 2026.docx", make_docx(["Revenue grew."]))
    html = client.get(reverse("conversations:detail", args=[chat.id])).content.decode()
    assert (
        'class="document-item"' in html and "Report 2026.docx" in html and 'data-status="processing"' in html
    )


def test_deleting_a_file_deletes_it_from_storage(
    client, alice, chat, documents_root, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    page_upload(client, chat, "a.txt", b"some text")
    document = Document.objects.get()
    assert len(stored_files(documents_root)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("conversations:document_delete", args=[document.id]))
    assert response.json() == {"id": document.id, "deleted": True}
    assert not Document.objects.exists() and stored_files(documents_root) == []


def test_deleting_the_conversation_or_the_account_deletes_files(
    client, alice, chat, documents_root, django_capture_on_commit_callbacks
):
    from accounts.services import account_delete

    client.force_login(alice)
    page_upload(client, chat, "a.txt", b"first")
    other = services.conversation_create(owner=alice, title="Other")
    page_upload(client, other, "b.txt", b"second")
    assert len(stored_files(documents_root)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        services.conversation_delete(conversation=chat)
    assert list(Document.objects.values_list("name", flat=True)) == ["b.txt"]
    assert len(stored_files(documents_root)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        account_delete(user=alice)
    assert not Document.objects.exists() and stored_files(documents_root) == []


def test_export_lists_file_names_not_contents(client, alice, chat):
    client.force_login(alice)
    page_upload(client, chat, "secret-plan.txt", b"the contents stay private")
    doc = archive.export_json(conversations=[chat])
    [entry] = doc["conversations"][0]["documents"]
    assert entry["name"] == "secret-plan.txt" and entry["kind"] == "text"
    assert "the contents" not in json.dumps(doc)
    assert "> Files: secret-plan.txt" in archive.export_markdown(conversations=[chat])


# --- the API -----------------------------------------------------------------------------------------------


def api_upload(client, conversation_id, key, name, data):
    return client.post(
        f"/api/conversations/{conversation_id}/documents",
        {"file": SimpleUploadedFile(name, data)},
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def test_api_upload_list_get_and_delete(client, alice, chat, documents_root, settings):
    _, key = api_key_create(user=alice)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    response = api_upload(client, chat.id, key, "report.docx", make_docx(["Revenue grew."]))
    assert response.status_code == 201, response.content
    created = response.json()
    assert (created["name"], created["kind"], created["status"]) == ("report.docx", "docx", "processing")
    listed = client.get(f"/api/conversations/{chat.id}/documents", **auth).json()["items"]
    assert [d["id"] for d in listed] == [created["id"]]
    assert client.get(f"/api/documents/{created['id']}", **auth).json()["status"] == "processing"
    assert client.delete(f"/api/documents/{created['id']}", **auth).status_code == 204
    assert not Document.objects.exists()


def test_api_refusals_are_clear_and_store_nothing(client, alice, chat, documents_root, settings):
    settings.DOCUMENTS_MAX_BYTES = 1000
    _, key = api_key_create(user=alice)
    response = api_upload(client, chat.id, key, "image.txt", PNG)
    assert response.status_code == 415 and response.json()["code"] == "unsupported_type"
    response = api_upload(client, chat.id, key, "big.txt", b"x" * 5000)
    assert response.status_code == 413 and response.json()["code"] == "too_large"
    response = client.post(f"/api/conversations/{chat.id}/documents", {}, HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 400 and response.json()["code"] == "empty"
    assert not Document.objects.exists() and stored_files(documents_root) == []


def test_api_needs_a_key_and_never_reaches_another_users_conversation(client, alice, bob, chat):
    response = client.post(
        f"/api/conversations/{chat.id}/documents", {"file": SimpleUploadedFile("a.txt", b"x")}
    )
    assert response.status_code == 401
    _, bob_key = api_key_create(user=bob)
    assert api_upload(client, chat.id, bob_key, "a.txt", b"text").status_code == 404
    _, alice_key = api_key_create(user=alice)
    created = api_upload(client, chat.id, alice_key, "a.txt", b"text").json()
    bob_auth = {"HTTP_AUTHORIZATION": f"Bearer {bob_key}"}
    assert client.get(f"/api/documents/{created['id']}", **bob_auth).status_code == 404
    assert client.delete(f"/api/documents/{created['id']}", **bob_auth).status_code == 404
    assert client.get(f"/api/conversations/{chat.id}/documents", **bob_auth).status_code == 404
    assert Document.objects.count() == 1


# --- S3-compatible storage -----------------------------------------------------------------------------------


def test_s3_storage_keeps_and_deletes_the_file(settings, alice, chat, django_capture_on_commit_callbacks):
    """django-storages' S3 backend against moto's fake S3 (in this process; no network)."""
    import boto3
    from moto import mock_aws

    from documents.services import document_add, document_delete

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
        s3.create_bucket(Bucket="chatsite-documents")
        settings.STORAGES = {
            **settings.STORAGES,
            "documents": {
                "BACKEND": "storages.backends.s3.S3Storage",
                "OPTIONS": {
                    "bucket_name": "chatsite-documents",
                    "region_name": "us-east-1",
                    "access_key": "t",
                    "secret_key": "t",
                    "location": "documents",
                    "default_acl": None,
                    "file_overwrite": False,
                },
            },
        }
        assert type(storages["documents"]).__name__ == "S3Storage"
        pdf = make_pdf(["Stored in a bucket."])
        document = document_add(user=alice, conversation=chat, name="bucket.pdf", data=pdf)
        key = f"documents/{document.file.name}"
        assert s3.get_object(Bucket="chatsite-documents", Key=key)["Body"].read() == pdf
        with document.file.open("rb") as handle:  # what the worker does
            assert handle.read() == pdf
        with django_capture_on_commit_callbacks(execute=True):
            document_delete(document=document)
        assert s3.list_objects_v2(Bucket="chatsite-documents").get("KeyCount", 0) == 0
