"""Recognising and reading uploaded files: PDF (pypdf), DOCX (python-docx), UTF-8 text and Markdown.

Pure Python, no Django: the upload check (:func:`inspect`) runs in the web process and must be cheap, the
text extraction (:func:`extract`) runs in a worker. The type comes from the content (magic bytes, then a real
parse), never from the file name; the name only tells Markdown from plain text, which read the same.
"""

from __future__ import annotations

import contextlib
import io
import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("pdf", "docx", "text", "markdown")
MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown", ".mkd")

# Leading bytes of common binary formats, to say what a refused file looks like.
_BINARY_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\x7fELF", "an executable program"),
    (b"MZ", "a Windows program"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"Rar!", "a RAR archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Office file (.doc/.xls); save it as .docx or PDF"),
    (b"ID3", "an MP3 file"),
    (b"OggS", "an Ogg file"),
    (b"SQLite format 3\x00", "an SQLite database"),
)
_DOCX_MAIN = "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"


class DocumentRejected(ValueError):
    """The file cannot be taken. ``code``: ``unsupported_type``, ``too_large``, ``too_many_pages``,
    ``corrupt``, ``encrypted``, ``empty``, ``too_much_text``; ``str()`` is a sentence for the person."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Limits:
    """Upload limits: bytes of the file, pages of a PDF, uncompressed bytes of a DOCX (zip), characters of
    extracted text."""

    max_bytes: int
    max_pages: int
    max_uncompressed_bytes: int
    max_text_chars: int


@dataclass(frozen=True)
class Inspection:
    """What the upload check found: ``kind`` (one of :data:`KINDS`), ``content_type`` (MIME), ``pages``
    (PDF only, else None)."""

    kind: str
    content_type: str
    pages: int | None = None


@dataclass(frozen=True)
class Section:
    """Extracted text of one part of a file: ``page`` is the 1-based PDF page, None for DOCX and text."""

    page: int | None
    text: str


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def inspect(data: bytes, *, name: str, limits: Limits) -> Inspection:
    """Check an uploaded file's size, type (by content) and page count without extracting its text.

    Raises :class:`DocumentRejected`. A PDF is opened with pypdf (its page tree must be readable and, if
    encrypted, open with an empty password); a DOCX must be a zip holding a Word main document within
    ``max_uncompressed_bytes`` that python-docx opens; text must decode as UTF-8 (or UTF-16 with a BOM).
    """
    if not data:
        raise DocumentRejected("empty", "The file is empty.")
    if len(data) > limits.max_bytes:
        raise DocumentRejected(
            "too_large", f"The file is {_mib(len(data))}; files are limited to {_mib(limits.max_bytes)}."
        )
    head = data[:1024]
    if b"%PDF-" in head:
        return Inspection("pdf", "application/pdf", pages=_pdf_pages(data, limits))
    if data.startswith(b"PK\x03\x04"):
        _docx_check(data, limits)
        return Inspection("docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document")
    decode_text(data)  # raises for binary content
    if name.lower().endswith(MARKDOWN_SUFFIXES):
        return Inspection("markdown", "text/markdown")
    return Inspection("text", "text/plain")


def decode_text(data: bytes) -> str:
    """``data`` as text: UTF-8 (a BOM is dropped) or UTF-16 with a BOM. Raises ``unsupported_type`` for
    binary content (undecodable bytes, NUL bytes, or many control characters)."""
    for magic, what in _BINARY_MAGIC:
        if data.startswith(magic):
            raise DocumentRejected(
                "unsupported_type",
                f"The file is {what}; only PDF, DOCX, text and Markdown files can be added.",
            )
    try:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentRejected(
            "unsupported_type",
            "The file is neither a PDF or DOCX nor UTF-8 text; only PDF, DOCX, text and Markdown files can be added.",
        ) from exc
    controls = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\f")
    if "\x00" in text or controls > max(8, len(text) // 100):
        raise DocumentRejected(
            "unsupported_type",
            "The file looks like binary data, not text; only PDF, DOCX, text and Markdown files can be added.",
        )
    return text


def _pdf_reader(data: bytes):
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentRejected(
                "encrypted", "The PDF is protected by a password; remove the protection and upload it again."
            )
        return reader
    except DocumentRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure on untrusted input means an unreadable file
        raise DocumentRejected("corrupt", f"The PDF could not be read ({_reason(exc)}).") from exc


def _reason(exc: Exception) -> str:
    text = str(exc).strip().rstrip(".")
    return text[:200] if text else type(exc).__name__


@contextlib.contextmanager
def _quiet_pypdf():
    """pypdf logs every recoverable oddity of a damaged file at WARNING; the refusal says enough."""
    log = logging.getLogger("pypdf")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _pdf_pages(data: bytes, limits: Limits) -> int:
    try:
        with _quiet_pypdf():
            reader = _pdf_reader(data)
            pages = len(reader.pages)
    except DocumentRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - see _pdf_reader
        raise DocumentRejected("corrupt", f"The PDF's pages could not be read ({_reason(exc)}).") from exc
    if pages == 0:
        raise DocumentRejected("empty", "The PDF has no pages.")
    if pages > limits.max_pages:
        raise DocumentRejected(
            "too_many_pages", f"The PDF has {pages} pages; files are limited to {limits.max_pages} pages."
        )
    return pages


def _docx_check(data: bytes, limits: Limits) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            names = {info.filename for info in infos}
            content_types = archive.read("[Content_Types].xml") if "[Content_Types].xml" in names else b""
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise DocumentRejected(
            "corrupt", f"The file looks like a zip archive but cannot be read ({_reason(exc)})."
        ) from exc
    if _DOCX_MAIN.encode() not in content_types:
        raise DocumentRejected(
            "unsupported_type",
            "The file is a zip archive but not a Word document (.docx); only PDF, DOCX, text and Markdown "
            "files can be added.",
        )
    uncompressed = sum(info.file_size for info in infos)
    if uncompressed > limits.max_uncompressed_bytes:
        raise DocumentRejected(
            "too_large",
            f"The document unpacks to {_mib(uncompressed)}; documents are limited to "
            f"{_mib(limits.max_uncompressed_bytes)} unpacked.",
        )
    _docx_open(data)


def _docx_open(data: bytes):
    import docx

    try:
        return docx.Document(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - any parser failure on untrusted input means an unreadable file
        raise DocumentRejected("corrupt", f"The Word document could not be read ({_reason(exc)}).") from exc


def extract(
    data: bytes,
    *,
    kind: str,
    limits: Limits,
    on_page: Callable[[int, int], None] | None = None,
) -> list[Section]:
    """The text of a file that passed :func:`inspect`, as sections: one per PDF page (pages without text
    are skipped), one for a DOCX (paragraphs and table cells in order) or a text file.

    ``on_page(done, total)`` is called after each PDF page (progress). Raises :class:`DocumentRejected`:
    ``corrupt`` when a page cannot be read, ``empty`` when no text is found (a scanned PDF: there is no
    OCR here), ``too_much_text`` past ``limits.max_text_chars``.
    """
    if kind == "pdf":
        sections = _pdf_sections(data, limits, on_page)
    elif kind == "docx":
        sections = [Section(None, _docx_text(data))]
    elif kind in ("text", "markdown"):
        sections = [Section(None, decode_text(data))]
    else:
        raise ValueError(f"unknown kind {kind!r}")
    sections = [Section(s.page, _clean(s.text)) for s in sections]
    sections = [s for s in sections if s.text.strip()]
    total = sum(len(s.text) for s in sections)
    if total == 0:
        what = (
            "The PDF has no text layer (a scan?); text cannot be read from images here."
            if kind == "pdf"
            else "The file has no text."
        )
        raise DocumentRejected("empty", what)
    if total > limits.max_text_chars:
        raise DocumentRejected(
            "too_much_text",
            f"The file holds {total:,} characters of text; files are limited to {limits.max_text_chars:,}.",
        )
    return sections


def _clean(text: str) -> str:
    # PostgreSQL text refuses NUL; other control characters only confuse the embedding model.
    return "".join(c if c >= " " or c in "\t\n" else ("\n" if c in "\r\f\v" else " ") for c in text)


def _pdf_sections(data: bytes, limits: Limits, on_page) -> list[Section]:
    try:
        with _quiet_pypdf():
            return _pdf_pages_text(data, limits, on_page)
    except DocumentRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - see _pdf_reader
        raise DocumentRejected("corrupt", f"The PDF could not be read ({_reason(exc)}).") from exc


def _pdf_pages_text(data: bytes, limits: Limits, on_page) -> list[Section]:
    reader = _pdf_reader(data)
    pages = len(reader.pages)
    if pages > limits.max_pages:
        raise DocumentRejected(
            "too_many_pages", f"The PDF has {pages} pages; files are limited to {limits.max_pages} pages."
        )
    sections = []
    for index, page in enumerate(reader.pages):
        try:
            text = page.extract_text() or ""
        except Exception as exc:  # noqa: BLE001 - see _pdf_reader
            raise DocumentRejected(
                "corrupt", f"Page {index + 1} of the PDF could not be read ({_reason(exc)})."
            ) from exc
        sections.append(Section(index + 1, text))
        if on_page is not None:
            on_page(index + 1, pages)
    return sections


def _docx_text(data: bytes) -> str:
    from docx.table import Table

    parts: list[str] = []
    # Paragraphs and tables in document order.
    for block in _docx_open(data).iter_inner_content():
        if isinstance(block, Table):
            for row in block.rows:
                cells: list[str] = []
                for cell in row.cells:
                    if not cells or cell.text != cells[-1]:  # a merged cell repeats its text
                        cells.append(cell.text)
                parts.append(" | ".join(cells))
        else:
            parts.append(block.text)
    return "\n".join(parts)
