"""Export and import of conversations.

JSON schema (``docs/export-format.md``), version 1::

    {"format": "chatsite.conversations", "version": 1, "exported_at": ISO-8601,
     "conversations": [{"title": str, "system_prompt": str, "created_at": ISO-8601,
                        "active_leaf": int | null, "documents": [{"name": str, ...}],
                        "messages": [{"id": int, "parent": int | null, "role": "user" | "assistant",
                                      "content": str, "created_at": ISO-8601, "status": str,
                                      "finish_reason": str, "model_name": str}]}]}

``id``/``parent`` are local to the file (the whole branch tree is kept); the import gives new ids.
Markdown export is the active branch only, for reading.

Imports are size-limited (``IMPORT_MAX_BYTES``, ``IMPORT_MAX_MESSAGES``) and atomic: one transaction, so a
bad file stores nothing. Also imported: a ChatGPT data export's ``conversations.json`` (its ``mapping``
tree, ``current_node`` as the active leaf; system/tool/hidden nodes are skipped and their children attach
to the nearest kept ancestor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from conversations import branches
from conversations.models import Conversation, Message
from database.storable_text import first_unstorable
from documents.selectors import document_names_for_conversations

FORMAT = "chatsite.conversations"
VERSION = 1
ROLES = (Message.Role.USER, Message.Role.ASSISTANT)
FINAL_STATUSES = {s for s in Message.Status.values if s not in Message.ACTIVE_STATUSES}


class ImportRejected(ValueError):
    """The file cannot be imported; the message says why, for the person who uploaded it."""


# --- export ---------------------------------------------------------------------------------------------------


def _conversation_dict(conversation: Conversation) -> dict:
    messages = list(conversation.messages.order_by("id"))
    files = document_names_for_conversations(conversation_ids=[conversation.id]).get(conversation.id, [])
    return {
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "created_at": conversation.created_at.isoformat(),
        "active_leaf": conversation.active_leaf_id,
        "messages": [
            {
                "id": m.id,
                "parent": m.parent_id,
                "role": m.role,
                "content": m.content,
                "created_at": m.created_at.isoformat(),
                "status": m.status,
                "finish_reason": m.finish_reason,
                "model_name": m.model_name,
            }
            for m in messages
        ],
        # The files added to the conversation: names and facts, not their contents (not re-imported).
        "documents": files,
    }


def export_json(*, conversations) -> dict:
    """The JSON document (a dict) for an iterable of conversations, whole branch trees included."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": timezone.now().isoformat(),
        "conversations": [_conversation_dict(c) for c in conversations],
    }


def export_markdown(*, conversations) -> str:
    """Markdown of each conversation's active branch: a heading per conversation, one section per turn."""
    parts = []
    for conversation in conversations:
        parts.append(f"# {conversation.title or 'Untitled'}\n")
        if conversation.system_prompt:
            parts.append(f"> System prompt: {conversation.system_prompt}\n")
        files = document_names_for_conversations(conversation_ids=[conversation.id]).get(conversation.id, [])
        if files:
            parts.append("> Files: " + ", ".join(f["name"] for f in files) + "\n")
        for m in branches.active_path(conversation=conversation).messages:
            who = "You" if m.role == Message.Role.USER else "Assistant"
            parts.append(f"## {who} · {timezone.localtime(m.created_at):%Y-%m-%d %H:%M}\n\n{m.content}\n")
    return "\n".join(parts)


# --- import ---------------------------------------------------------------------------------------------------


@dataclass
class _Node:
    key: object
    parent: object
    role: str
    content: str
    created_at: datetime
    status: str = Message.Status.COMPLETED
    finish_reason: str = ""
    model_name: str = ""


@dataclass
class _Parsed:
    title: str
    system_prompt: str
    created_at: datetime | None
    nodes: list[_Node] = field(default_factory=list)
    active: object = None


def _time(value, where: str) -> datetime:
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    parsed = parse_datetime(value) if isinstance(value, str) else None
    if parsed is None:
        raise ImportRejected(f"{where}: not a date and time: {value!r}")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)


def _load(data: bytes) -> object:
    if len(data) > settings.IMPORT_MAX_BYTES:
        raise ImportRejected(
            f"The file is {len(data) // 1024} KiB; imports are limited to {settings.IMPORT_MAX_BYTES // 1024} KiB."
        )
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ImportRejected("The file is not UTF-8 text.") from exc
    except json.JSONDecodeError as exc:
        raise ImportRejected(f"The file is not valid JSON (line {exc.lineno}, column {exc.colno}).") from exc
    unstorable = first_unstorable(doc)
    if unstorable is not None:  # PostgreSQL text cannot hold it; refuse the file before storing any of it
        where, problem = unstorable
        raise ImportRejected(f"{where} {problem}, which cannot be stored; nothing was imported.")
    return doc


def _parse_chatsite(doc: dict) -> list[_Parsed]:
    if doc.get("version") != VERSION:
        raise ImportRejected(
            f"Unsupported chatsite export version {doc.get('version')!r} (expected {VERSION})."
        )
    items = doc.get("conversations")
    if not isinstance(items, list):
        raise ImportRejected('"conversations" must be a list.')
    parsed = []
    for i, c in enumerate(items):
        where = f"conversation {i + 1}"
        if not isinstance(c, dict) or not isinstance(c.get("messages"), list):
            raise ImportRejected(f'{where}: must be an object with a "messages" list.')
        p = _Parsed(
            title=str(c.get("title") or "")[:200],
            system_prompt=str(c.get("system_prompt") or ""),
            created_at=_time(c["created_at"], where) if c.get("created_at") else None,
            active=c.get("active_leaf"),
        )
        for j, m in enumerate(c["messages"]):
            mw = f"{where}, message {j + 1}"
            if not isinstance(m, dict):
                raise ImportRejected(f"{mw}: must be an object.")
            if m.get("role") not in ROLES:
                raise ImportRejected(f'{mw}: role must be "user" or "assistant", not {m.get("role")!r}.')
            if not isinstance(m.get("content"), str):
                raise ImportRejected(f"{mw}: content must be text.")
            status = m.get("status") or Message.Status.COMPLETED
            if status not in FINAL_STATUSES:
                status = Message.Status.INTERRUPTED
            p.nodes.append(
                _Node(
                    key=m.get("id", j),
                    parent=m.get("parent"),
                    role=m["role"],
                    content=m["content"],
                    created_at=_time(m.get("created_at"), mw),
                    status=status,
                    finish_reason=str(m.get("finish_reason") or "")[:16],
                    model_name=str(m.get("model_name") or "")[:100],
                )
            )
        parsed.append(p)
    return parsed


def _chatgpt_text(content: dict) -> str:
    parts = content.get("parts") if isinstance(content, dict) else None
    if isinstance(parts, list):
        return "\n".join(p for p in parts if isinstance(p, str)).strip()
    text = content.get("text") if isinstance(content, dict) else None
    return text.strip() if isinstance(text, str) else ""


def _parse_chatgpt_one(c: dict, where: str) -> _Parsed:
    if not isinstance(c, dict) or not isinstance(c.get("mapping"), dict):
        raise ImportRejected(f'{where}: not a ChatGPT conversation (no "mapping").')
    mapping = c["mapping"]
    p = _Parsed(
        title=str(c.get("title") or "")[:200],
        system_prompt="",
        created_at=_time(c["create_time"], where) if c.get("create_time") else None,
    )
    # Parents before children: walk the tree from its roots (nodes whose parent is not in the file).
    order, stack, seen = [], [k for k, n in mapping.items() if n.get("parent") not in mapping], set()
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        order.append(node_id)
        stack.extend(reversed([ch for ch in mapping[node_id].get("children") or [] if ch in mapping]))
    # node id -> nearest kept ancestor (itself when kept); parents are settled before their children.
    kept: dict[str, str | None] = {}
    for node_id in order:
        node = mapping[node_id]
        message = node.get("message") or {}
        role = (message.get("author") or {}).get("role")
        text = _chatgpt_text(message.get("content") or {})
        hidden = (message.get("metadata") or {}).get("is_visually_hidden_from_conversation")
        above = kept.get(node.get("parent"))
        if role == "system" and text and not p.system_prompt and not hidden:
            p.system_prompt = text
        if role in ROLES and text and not hidden:
            p.nodes.append(
                _Node(
                    key=node_id,
                    parent=above,
                    role=role,
                    content=text,
                    created_at=_time(message["create_time"], where)
                    if message.get("create_time")
                    else (p.created_at or timezone.now()),
                    model_name=str((message.get("metadata") or {}).get("model_slug") or "")[:100],
                )
            )
            kept[node_id] = node_id
        else:
            kept[node_id] = above
    p.active = kept.get(c.get("current_node"))
    return p


def _parse_chatgpt(items: list) -> list[_Parsed]:
    return [_parse_chatgpt_one(c, f"conversation {i + 1}") for i, c in enumerate(items)]


def parse_import(data: bytes) -> list[_Parsed]:
    """Recognise and validate a chatsite export or a ChatGPT ``conversations.json``.
    Raises :class:`ImportRejected` with a reason a person can act on."""
    doc = _load(data)
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        parsed = _parse_chatsite(doc)
    elif isinstance(doc, list) and (not doc or (isinstance(doc[0], dict) and "mapping" in doc[0])):
        parsed = _parse_chatgpt(doc)
    else:
        raise ImportRejected(
            "Not a chatsite export or a ChatGPT conversations.json (expected "
            f'"format": "{FORMAT}", or a list of conversations with a "mapping").'
        )
    if not parsed:
        raise ImportRejected("The file holds no conversations.")
    total = sum(len(p.nodes) for p in parsed)
    if total > settings.IMPORT_MAX_MESSAGES:
        raise ImportRejected(
            f"The file holds {total} messages; imports are limited to {settings.IMPORT_MAX_MESSAGES}."
        )
    return parsed


def _reserve_ids(n: int) -> list[int]:
    # Ids drawn from the table's own sequence, so the whole tree goes in with one bulk INSERT
    # (parents referenced by id before they exist in the batch; the FK is checked at commit).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('conversations_message', 'id')) FROM generate_series(1, %s)",
            [n],
        )
        return [row[0] for row in cursor.fetchall()]


def _store(owner, p: _Parsed) -> Conversation:
    keys = [n.key for n in p.nodes]
    if len(set(map(str, keys))) != len(keys):
        raise ImportRejected(f'"{p.title}": two messages share an id.')
    ids = dict(zip(map(str, keys), _reserve_ids(len(keys)), strict=True)) if keys else {}
    for n in p.nodes:
        if n.parent is not None and str(n.parent) not in ids:
            raise ImportRejected(
                f'"{p.title}": a message names a parent {n.parent!r} that is not in the file.'
            )
    conversation = Conversation.objects.create(owner=owner, title=p.title, system_prompt=p.system_prompt)
    messages = [
        Message(
            id=ids[str(n.key)],
            conversation=conversation,
            parent_id=ids[str(n.parent)] if n.parent is not None else None,
            role=n.role,
            content=n.content,
            status=n.status,
            finish_reason=n.finish_reason,
            model_name=n.model_name,
        )
        for n in p.nodes
    ]
    Message.objects.bulk_create(messages, batch_size=1000)
    # auto_now_add stamped "now": put the file's timestamps back.
    for m, n in zip(messages, p.nodes, strict=True):
        m.created_at = n.created_at
    Message.objects.bulk_update(messages, ["created_at"], batch_size=1000)
    if p.nodes:
        children: dict[int, int] = {}
        for m in messages:  # the newest child of each parent is its active one
            if m.parent_id is not None:
                children[m.parent_id] = m.id
        leaf = ids.get(str(p.active)) if p.active is not None else None
        leaf = leaf or messages[-1].id
        Message.objects.bulk_update(
            [Message(id=parent, active_child_id=child) for parent, child in children.items()],
            ["active_child"],
            batch_size=1000,
        )
        branches.branch_switch(conversation=conversation, message=Message(id=leaf, conversation=conversation))
    newest = max([n.created_at for n in p.nodes] + [p.created_at or timezone.now()])
    Conversation.objects.filter(pk=conversation.pk).update(
        created_at=p.created_at or newest, updated_at=newest
    )
    return conversation


def import_conversations(*, owner, data: bytes) -> list[Conversation]:
    """Import every conversation of a file for ``owner``, all or nothing (one transaction).
    Raises :class:`ImportRejected`; nothing is stored then."""
    parsed = parse_import(data)
    with transaction.atomic():
        return [_store(owner, p) for p in parsed]
