"""Chunking and embedding with the real packaged all-MiniLM-L6-v2, and the worker's batcher."""

import threading

import numpy as np
import pytest

from memory.batching import EmbeddingBatcher
from memory.chunking import chunk_text
from memory.embedding import DIMENSIONS, tokenizer


def test_short_text_is_one_chunk_with_its_offsets():
    pieces = chunk_text("  My cat is called Biscuit.  ")
    assert [(p.text, p.char_start) for p in pieces] == [("My cat is called Biscuit.", 0)]
    assert pieces[0].tokens == len(
        tokenizer().encode("My cat is called Biscuit.", add_special_tokens=False).ids
    )


def test_long_text_is_cut_into_overlapping_windows_that_cover_it():
    text = " ".join(f"word{i}" for i in range(400))
    pieces = chunk_text(text, max_tokens=64, overlap_tokens=16)
    assert len(pieces) > 3
    assert all(p.tokens <= 64 for p in pieces)
    assert pieces[0].text.startswith("word0 ") and pieces[-1].text.endswith("word399")
    for a, b in zip(pieces, pieces[1:], strict=False):
        assert b.char_start < a.char_end  # overlap: the next window starts inside the previous one
        assert text[b.char_start : b.char_end].strip() == b.text


def test_blank_text_gives_no_chunks_and_bad_overlap_is_refused():
    assert chunk_text("   \n ") == []
    with pytest.raises(ValueError):
        chunk_text("x", max_tokens=10, overlap_tokens=10)


def test_packaged_model_embeds_unit_vectors_that_rank_paraphrases_first(embedder):
    vectors = embedder.encode(
        ["My cat is called Biscuit.", "The name of my cat is Biscuit.", "Quarterly tax filing deadlines."]
    )
    assert vectors.shape == (3, DIMENSIONS) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > 0.8
    assert vectors[0] @ vectors[2] < 0.3
    assert embedder.encode([]).shape == (0, DIMENSIONS)


def test_batcher_puts_concurrent_requests_into_one_model_call_and_returns_each_its_rows(embedder):
    calls = []

    def encode(texts):
        calls.append(len(texts))
        return embedder.encode(texts)

    batcher = EmbeddingBatcher(encode, max_batch=64, max_wait_s=0.2)
    texts = [f"note number {i} about gardening" for i in range(12)]
    futures = []
    barrier = threading.Barrier(4)

    def submit(i):
        barrier.wait()
        futures.append((i, batcher.submit(texts[i * 3 : i * 3 + 3])))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = {i: f.result(timeout=30) for i, f in futures}
    batcher.stop()

    assert calls == [12]
    expected = embedder.encode(texts)
    for i in range(4):
        assert np.allclose(results[i], expected[i * 3 : i * 3 + 3], atol=1e-5)


def test_batcher_serves_a_question_before_waiting_bulk_work():
    order = []
    release = threading.Event()

    def encode(texts):
        order.append(list(texts))
        if texts == ["first"]:
            release.wait(5)
        return np.zeros((len(texts), DIMENSIONS), dtype=np.float32)

    batcher = EmbeddingBatcher(encode, max_batch=1, max_wait_s=0)
    first = batcher.submit(["first"])
    while not order:
        threading.Event().wait(0.01)
    bulk = batcher.submit(["bulk"])
    question = batcher.submit(["question"], priority=True)
    release.set()
    for f in (first, bulk, question):
        f.result(timeout=5)
    batcher.stop()

    assert order == [["first"], ["question"], ["bulk"]]


def test_a_model_error_reaches_every_waiter():
    def encode(texts):
        raise RuntimeError("model failed")

    batcher = EmbeddingBatcher(encode, max_wait_s=0)
    with pytest.raises(RuntimeError, match="model failed"):
        batcher.submit(["x"]).result(timeout=5)
    batcher.stop()
