"""The documents flow in a real browser (Playwright driving Debian's Chromium) against the live stack:
daphne, a chat worker with the real default model, an embeddings worker with the packaged
all-MiniLM-L6-v2, PostgreSQL and Redis. Add a PDF with the button, a text file by dropping it, watch them
become ready, ask about the PDF, see the citation chip and its passage, reload: all still there."""

import pytest

from billing.models import Tier
from devtools.document_files import make_pdf
from documents.models import Citation, Document
from tests.browser.helpers import wait_last_assistant
from tests.integration.test_memory_worker import embeddings_worker  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PAGES = [
    "Lisbon city notes. Trams run from seven in the morning. The castle opens at nine.",
    "Island trip. The ferry to Tavira island leaves from pier three at 9:40 every morning "
    "and the last boat back departs at 19:15.",
    "Restaurants. Lunch is usually served from noon until three in the afternoon.",
]


def test_upload_a_pdf_ask_about_it_see_the_citation_and_reload(
    open_page,
    make_user,
    celery_worker,
    embeddings_worker,  # noqa: F811
    shots_dir,
):
    alice = make_user("doc-reader")
    Tier.objects.filter(name="free").update(max_reply_tokens=24)
    page = open_page(alice)
    page.goto("/chat/")
    page.wait_for_function("() => window.chatReady")

    # The button: a PDF starts the chat; its row shows the processing, then ready.
    page.set_input_files(
        "#document-input",
        files=[{"name": "lisbon.pdf", "mimeType": "application/pdf", "buffer": make_pdf(PAGES)}],
    )
    page.wait_for_url("**/chat/*/")
    pdf_row = page.locator(".document-item", has_text="lisbon.pdf")
    pdf_row.wait_for()
    page.wait_for_function(
        "() => document.querySelector('.document-item[data-status=ready]')", timeout=120_000
    )
    assert "passage" in pdf_row.locator(".document-state").inner_text()
    document = Document.objects.get(name="lisbon.pdf")
    assert document.status == "ready" and document.owner == alice

    # Drag and drop: a text file dropped on the chat is added to the same conversation.
    page.evaluate(
        """() => {
          const dt = new DataTransfer();
          dt.items.add(new File(['Packing list: sunscreen, hat, ferry tickets.'], 'packing.txt', {type: 'text/plain'}));
          const main = document.querySelector('.chat-main');
          main.dispatchEvent(new DragEvent('dragenter', {dataTransfer: dt, bubbles: true}));
          main.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));
        }"""
    )
    page.locator(".document-item[data-status=ready]", has_text="packing.txt").wait_for(timeout=120_000)
    assert set(Document.objects.filter(owner=alice).values_list("name", flat=True)) == {
        "lisbon.pdf",
        "packing.txt",
    }

    # Ask about the PDF: the reply carries a chip citing the ferry page, which opens the passage.
    page.fill("#composer", "When does the ferry to Tavira island leave?")
    page.press("#composer", "Enter")
    wait_last_assistant(page, "completed")
    chip = page.locator(".message.assistant .citation-chip", has_text="lisbon.pdf · p. 2").first
    chip.wait_for()
    chip.click()
    dialog = page.locator("#passage-dialog")
    dialog.wait_for(state="visible")
    page.screenshot(path=shots_dir / "documents-passage.png")
    assert "9:40" in dialog.locator(".passage-text").inner_text()
    assert "Page 2" in dialog.locator(".passage-source").inner_text()
    dialog.locator("button[type=submit]").click()
    reply_id = int(page.locator(".message.assistant").last.get_attribute("data-message-id"))
    stored = Citation.objects.filter(message_id=reply_id).select_related("chunk")
    assert any("9:40" in c.chunk.text for c in stored)

    # Reload: the files and the chip are still there.
    page.reload()
    page.wait_for_function("() => window.chatReady")
    assert page.locator(".document-item[data-status=ready]").count() == 2
    page.locator(".message.assistant .citation-chip", has_text="lisbon.pdf · p. 2").first.wait_for()
    page.screenshot(path=shots_dir / "documents-reloaded.png")
