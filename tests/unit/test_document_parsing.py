"""Recognising and reading uploaded files (documents.parsing): each type by content, the limits, and the
clear refusals of bad files. Fixture files are made here (devtools/document_files.py)."""

import pytest

from devtools.document_files import PNG, make_docx, make_pdf, make_zip
from documents.parsing import DocumentRejected, Limits, extract, inspect

LIMITS = Limits(max_bytes=1_000_000, max_pages=5, max_uncompressed_bytes=2_000_000, max_text_chars=50_000)


def refused(data: bytes, name: str, limits: Limits = LIMITS) -> DocumentRejected:
    with pytest.raises(DocumentRejected) as info:
        inspect(data, name=name, limits=limits)
    return info.value


def test_pdf_is_read_page_by_page_with_progress():
    data = make_pdf(["The ferry to Tavira leaves at 9:40 (pier 3).", "", "Lunch is at the Mercado."])
    found = inspect(data, name="trip.bin", limits=LIMITS)  # the name says nothing; the content does
    assert (found.kind, found.content_type, found.pages) == ("pdf", "application/pdf", 3)
    seen = []
    sections = extract(
        data, kind="pdf", limits=LIMITS, on_page=lambda done, total: seen.append((done, total))
    )
    assert [s.page for s in sections] == [1, 3]  # the empty page has no section
    assert "ferry to Tavira leaves at 9:40 (pier 3)" in sections[0].text
    assert "Mercado" in sections[1].text
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_docx_paragraphs_and_tables_in_order():
    data = make_docx(
        ["Quarterly report", "Revenue grew in the north."], table=[["Region", "Sales"], ["North", "42"]]
    )
    found = inspect(data, name="report.docx", limits=LIMITS)
    assert found.kind == "docx" and found.pages is None
    [section] = extract(data, kind="docx", limits=LIMITS)
    assert section.page is None
    text = section.text
    assert text.index("Quarterly report") < text.index("Revenue grew") < text.index("North | 42")


@pytest.mark.parametrize(
    "name,kind,content_type",
    [("notes.txt", "text", "text/plain"), ("README.md", "markdown", "text/markdown")],
)
def test_text_and_markdown(name, kind, content_type):
    data = "# Heading\n\nCafé opens at 8.\n".encode()
    found = inspect(data, name=name, limits=LIMITS)
    assert (found.kind, found.content_type) == (kind, content_type)
    [section] = extract(data, kind=kind, limits=LIMITS)
    assert "Café opens at 8." in section.text


def test_utf16_text_with_bom_is_text():
    data = "Hello, wörld".encode("utf-16")
    assert inspect(data, name="x.txt", limits=LIMITS).kind == "text"
    assert extract(data, kind="text", limits=LIMITS)[0].text == "Hello, wörld"


def test_renamed_binary_is_refused_by_content():
    assert refused(PNG, "holiday.pdf").code == "unsupported_type"
    assert "PNG image" in str(refused(PNG, "notes.txt"))
    random_bytes = bytes(range(256)) * 8
    assert refused(random_bytes, "notes.txt").code == "unsupported_type"
    assert refused(b"ab\x00cd" * 100, "notes.md").code == "unsupported_type"


def test_zip_that_is_not_a_word_document_is_refused():
    sheet = make_zip(
        {"[Content_Types].xml": b"<Types>spreadsheetml.sheet.main+xml</Types>", "xl/workbook.xml": b"<x/>"}
    )
    error = refused(sheet, "budget.docx")
    assert error.code == "unsupported_type" and "not a Word document" in str(error)


def test_corrupt_files_are_refused_with_a_reason():
    assert refused(b"%PDF-1.7\n" + b"\x00garbage" * 50, "broken.pdf").code == "corrupt"
    assert refused(b"PK\x03\x04" + b"not really a zip" * 10, "broken.docx").code == "corrupt"
    # A zip that says it is a Word document but whose main part is missing.
    fake = make_zip(
        {
            "[Content_Types].xml": b'<Types><Override PartName="/word/document.xml" ContentType="'
            b'application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
        }
    )
    assert refused(fake, "fake.docx").code == "corrupt"


def test_size_and_page_limits():
    assert refused(b"", "empty.txt").code == "empty"
    small = Limits(max_bytes=100, max_pages=5, max_uncompressed_bytes=2_000_000, max_text_chars=50_000)
    error = refused(b"x" * 101, "big.txt", small)
    assert error.code == "too_large" and "limited to" in str(error)
    error = refused(make_pdf([f"page {i}" for i in range(6)]), "long.pdf")
    assert error.code == "too_many_pages" and "6 pages" in str(error)


def test_zip_bomb_is_refused_on_its_unpacked_size():
    bomb = make_docx(["x"])
    tight = Limits(max_bytes=1_000_000, max_pages=5, max_uncompressed_bytes=1000, max_text_chars=50_000)
    assert refused(bomb, "bomb.docx", tight).code == "too_large"


def test_extraction_refuses_too_much_text_and_textless_pdfs():
    data = ("word " * 20_000).encode()
    with pytest.raises(DocumentRejected) as info:
        extract(data, kind="text", limits=LIMITS)
    assert info.value.code == "too_much_text"
    with pytest.raises(DocumentRejected) as info:
        extract(make_pdf(["", ""]), kind="pdf", limits=LIMITS)
    assert info.value.code == "empty" and "no text layer" in str(info.value)
