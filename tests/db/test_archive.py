"""Export and import: JSON round trip with branches, Markdown, ChatGPT exports, limits and atomicity."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from conversations import archive, branches, services
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def branched(alice):
    c = services.conversation_create(owner=alice, title="Branchy", system_prompt="Be brief.")
    q = services.message_create(conversation=c, role="user", content="question")
    services.message_create(conversation=c, role="assistant", content="old answer")
    services.message_create(conversation=c, role="assistant", content="new answer", parent=q)
    Message.objects.filter(conversation=c).update(created_at="2025-01-02T03:04:05Z")
    return c


CHATGPT = [
    {
        "title": "From ChatGPT",
        "create_time": 1700000000.0,
        "current_node": "n4",
        "mapping": {
            "root": {"id": "root", "message": None, "parent": None, "children": ["n1"]},
            "n1": {
                "id": "n1",
                "message": {"author": {"role": "system"}, "content": {"content_type": "text", "parts": [""]}},
                "parent": "root",
                "children": ["n2"],
            },
            "n2": {
                "id": "n2",
                "message": {
                    "author": {"role": "user"},
                    "create_time": 1700000001.0,
                    "content": {"content_type": "text", "parts": ["What is 2+2?"]},
                },
                "parent": "n1",
                "children": ["n3", "n4"],
            },
            "n3": {
                "id": "n3",
                "message": {
                    "author": {"role": "assistant"},
                    "create_time": 1700000002.0,
                    "content": {"content_type": "text", "parts": ["5"]},
                },
                "parent": "n2",
                "children": [],
            },
            "n4": {
                "id": "n4",
                "message": {
                    "author": {"role": "assistant"},
                    "create_time": 1700000003.0,
                    "content": {"content_type": "text", "parts": ["4"]},
                    "metadata": {"model_slug": "gpt-4o"},
                },
                "parent": "n2",
                "children": [],
            },
        },
    }
]


def test_json_round_trip_keeps_branches_roles_order_and_timestamps(alice, bob, branched):
    doc = archive.export_json(conversations=[branched])
    imported = archive.import_conversations(owner=bob, data=json.dumps(doc).encode())
    assert len(imported) == 1
    copy = imported[0]
    assert copy.owner == bob and copy.title == "Branchy" and copy.system_prompt == "Be brief."
    assert [m.content for m in branches.active_path(conversation=copy).messages] == ["question", "new answer"]
    assert sorted(copy.messages.values_list("role", "content")) == sorted(
        branched.messages.values_list("role", "content")
    )
    assert {m.created_at.isoformat() for m in copy.messages.all()} == {"2025-01-02T03:04:05+00:00"}
    assert (
        archive.export_json(conversations=[copy])["conversations"][0]["messages"][0]["content"] == "question"
    )


def test_markdown_export_holds_the_active_branch(branched):
    text = archive.export_markdown(conversations=[branched])
    assert "# Branchy" in text and "new answer" in text and "old answer" not in text


def test_chatgpt_export_imports_its_tree_and_current_branch(alice):
    (c,) = archive.import_conversations(owner=alice, data=json.dumps(CHATGPT).encode())
    path = branches.active_path(conversation=c).messages
    assert [(m.role, m.content) for m in path] == [("user", "What is 2+2?"), ("assistant", "4")]
    assert path[1].model_name == "gpt-4o" and path[1].sibling_count == 2
    assert path[0].created_at.timestamp() == 1700000001.0 and c.title == "From ChatGPT"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe nope", "UTF-8"),
        (b"{not json", "not valid JSON"),
        (b'{"hello": 1}', "Not a chatsite export"),
        (json.dumps({"format": "chatsite.conversations", "version": 99}).encode(), "version"),
    ],
)
def test_bad_files_get_a_clear_error_and_store_nothing(alice, data, reason):
    with pytest.raises(archive.ImportRejected, match=reason):
        archive.import_conversations(owner=alice, data=data)
    assert Conversation.objects.count() == 0


def test_import_is_all_or_nothing(alice, branched):
    doc = archive.export_json(conversations=[branched, branched])
    doc["conversations"][1]["messages"][1]["role"] = "wizard"  # the second conversation is bad
    before = (Conversation.objects.count(), Message.objects.count())
    with pytest.raises(archive.ImportRejected, match="wizard"):
        archive.import_conversations(owner=alice, data=json.dumps(doc).encode())
    assert (Conversation.objects.count(), Message.objects.count()) == before


def test_import_fails_atomically_when_the_database_refuses_midway(alice, branched):
    doc = archive.export_json(conversations=[branched, branched])
    doc["conversations"][1]["messages"][0]["content"] = "bad\x00nul"  # PostgreSQL refuses NUL in text
    before = (Conversation.objects.count(), Message.objects.count())
    with pytest.raises(Exception):  # noqa: B017 - any database error; the point is what is left behind
        archive.import_conversations(owner=alice, data=json.dumps(doc).encode())
    assert (Conversation.objects.count(), Message.objects.count()) == before


def test_imports_are_size_limited(alice, settings):
    settings.IMPORT_MAX_BYTES = 100
    with pytest.raises(archive.ImportRejected, match="limited"):
        archive.import_conversations(owner=alice, data=b" " * 101)
    settings.IMPORT_MAX_BYTES = 10_000_000
    settings.IMPORT_MAX_MESSAGES = 1
    with pytest.raises(archive.ImportRejected, match="limited to 1"):
        archive.import_conversations(owner=alice, data=json.dumps(CHATGPT).encode())


def test_export_and_import_views(client, alice, branched):
    client.force_login(alice)
    one = client.get(reverse("conversations:export", args=[branched.id]), {"format": "json"})
    assert one.status_code == 200 and "attachment" in one["Content-Disposition"]
    md = client.get(reverse("conversations:export_all"), {"format": "md"})
    assert md.status_code == 200 and b"# Branchy" in md.content
    upload = SimpleUploadedFile("export.json", one.content, content_type="application/json")
    response = client.post(reverse("conversations:import"), {"file": upload})
    assert response.status_code == 302 and Conversation.objects.filter(owner=alice).count() == 2
    bad = SimpleUploadedFile("bad.json", b"[1, 2", content_type="application/json")
    response = client.post(reverse("conversations:import"), {"file": bad})
    assert response.status_code == 400 and "Nothing was imported" in response.content.decode()


def test_other_users_conversation_cannot_be_exported(client, bob, branched):
    client.force_login(bob)
    assert client.get(reverse("conversations:export", args=[branched.id])).status_code == 404
