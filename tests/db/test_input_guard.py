"""Text PostgreSQL cannot store (NUL characters, lone surrogates) in any HTTP form field, query parameter,
uploaded file name or JSON string is refused with a 400 naming the field, and nothing is changed."""

import html
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from api.models import ApiKey
from api.services import api_key_create
from conversations.models import Conversation, Message
from conversations.services import conversation_create, message_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(alice):
    conversation = conversation_create(owner=alice, title="Before", system_prompt="Be brief.")
    message_create(conversation=conversation, role="user", content="hello")
    return conversation


@pytest.fixture
def signed_in(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def bearer(alice):
    _key, secret = api_key_create(user=alice, name="laptop")
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def unchanged(conversation):
    conversation.refresh_from_db()
    return (conversation.title, conversation.system_prompt) == ("Before", "Be brief.")


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
def test_renaming_with_a_nul_in_the_title_is_refused_and_changes_nothing(signed_in, chat, accept):
    response = signed_in.post(f"/chat/{chat.id}/rename/", {"title": "bad\x00title"}, HTTP_ACCEPT=accept)
    assert response.status_code == 400
    text = html.unescape(response.content.decode())
    assert "'title' contains a NUL character" in text and "Nothing was changed" in text
    if accept == "application/json":
        assert "title" in response.json()["error"]
    assert unchanged(chat)


@pytest.mark.parametrize(
    ("url", "data", "field"),
    [
        ("/chat/{id}/system-prompt/", {"system_prompt": "x\x00"}, "system_prompt"),
        ("/settings/api-keys/", {"name": "key\x00"}, "name"),
        ("/chat/{id}/branch/", {"message_id": "1\x00"}, "message_id"),
        ("/chat/{id}/rename/", {"ti\x00tle": "fine"}, "<field name>"),
    ],
)
def test_every_form_field_with_a_nul_is_refused(signed_in, chat, url, data, field):
    response = signed_in.post(url.format(id=chat.id), data)
    assert response.status_code == 400
    assert f"'{field}' contains a NUL character" in html.unescape(response.content.decode())
    assert unchanged(chat) and not ApiKey.objects.exists()


def test_an_urlencoded_form_field_with_a_nul_is_refused(signed_in, chat):
    body = "title=bad%00title"
    response = signed_in.post(
        f"/chat/{chat.id}/rename/", body, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400 and "'title' contains a NUL character" in html.unescape(
        response.content.decode()
    )
    assert unchanged(chat)


def test_a_query_parameter_with_a_nul_is_refused(signed_in, chat):
    response = signed_in.get("/chat/search/", {"q": "he\x00llo"})
    assert response.status_code == 400 and "'q' contains a NUL character" in html.unescape(
        response.content.decode()
    )


def test_sign_up_with_a_nul_in_the_user_name_creates_no_account(client, django_user_model):
    response = client.post(
        "/accounts/signup/",
        {
            "username": "eve\x00",
            "email": "eve@example.com",
            "password1": "pw-Secret-123",
            "password2": "pw-Secret-123",
        },
    )
    assert response.status_code == 400
    assert not django_user_model.objects.filter(email="eve@example.com").exists()


def test_a_nul_in_an_uploaded_file_name_is_dropped_by_the_parser_and_the_file_imports(signed_in, alice):
    doc = {
        "format": "chatsite.conversations",
        "version": 1,
        "conversations": [
            {
                "title": "Named",
                "messages": [{"role": "user", "content": "hi", "created_at": "2026-11-01T10:00:00+00:00"}],
            }
        ],
    }
    upload = SimpleUploadedFile("export\x00.json", json.dumps(doc).encode(), content_type="application/json")
    response = signed_in.post("/chat/import/", {"file": upload})
    assert response.status_code == 302
    assert Conversation.objects.filter(owner=alice, title="Named").count() == 1


def test_an_imported_file_holding_a_nul_imports_nothing(signed_in, alice):
    doc = {
        "format": "chatsite.conversations",
        "version": 1,
        "conversations": [{"title": "Imported", "messages": [{"role": "user", "content": "a\u0000b"}]}],
    }
    upload = SimpleUploadedFile("export.json", json.dumps(doc).encode(), content_type="application/json")
    response = signed_in.post("/chat/import/", {"file": upload}, follow=True)
    assert "contains a NUL character, which cannot be stored; nothing was imported" in html.unescape(
        response.content.decode()
    )
    assert not Conversation.objects.filter(owner=alice, title="Imported").exists()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"title": "bad\\u0000"}', "contains a NUL character"),
        ('{"title": "bad\\ud800"}', "contains a lone surrogate (invalid Unicode)"),
    ],
)
def test_history_api_rename_with_unstorable_text_is_a_400_naming_the_field(
    client, bearer, chat, body, problem
):
    response = client.patch(f"/api/conversations/{chat.id}", body, content_type="application/json", **bearer)
    assert response.status_code == 400
    assert response.json() == {"detail": f"'title' {problem}, which cannot be stored. Nothing was changed."}
    assert unchanged(chat)


def test_an_escaped_backslash_before_u0000_is_ordinary_text(client, bearer, chat):
    response = client.patch(
        f"/api/conversations/{chat.id}", '{"title": "a\\\\u0000b"}', content_type="application/json", **bearer
    )
    assert response.status_code == 200
    chat.refresh_from_db()
    assert chat.title == "a\\u0000b"


@pytest.mark.parametrize(
    ("content", "param"),
    [
        ({"role": "user", "content": "hi\u0000"}, "messages[0].content"),
        ({"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}, "messages[0].content[0].text"),
    ],
)
def test_a_completion_with_unstorable_text_is_refused_in_openais_shape(client, bearer, alice, content, param):
    body = json.dumps({"model": "smollm2-135m-instruct", "messages": [content]})
    before = Message.objects.count()
    response = client.post("/v1/chat/completions", body, content_type="application/json", **bearer)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, "invalid_value")
    assert Message.objects.count() == before and not Conversation.objects.filter(owner=alice).exists()


def test_a_json_body_sent_without_its_content_type_is_checked_too(client, bearer, alice):
    # As `curl -d` sends it (application/x-www-form-urlencoded); the /v1 views parse the body anyway.
    body = json.dumps({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "\u0000"}]})
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):
        response = client.post("/v1/chat/completions", body, content_type=content_type, **bearer)
        assert response.status_code == 400, content_type
        assert response.json()["error"]["param"] == "messages[0].content"
    assert not Conversation.objects.filter(owner=alice).exists()
