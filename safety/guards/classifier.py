"""A trained classifier whose weights ship inside a PyPI wheel: alt-profanity-check (MIT; a TF-IDF
vectorizer and a linear SVM with sigmoid calibration, ~1 MB of joblib files in the ``profanity_check``
package, trained on ~200k labelled comments: the Wikipedia Talk "toxic" and Twitter hate-speech sets).

The package's own ``predict_prob`` goes through scikit-learn's input validation and sparse matrices, about
2 ms a call on one message; the same arithmetic over a precomputed ``{term: (idf, w_1..w_k)}`` table is a
few microseconds per word. :class:`ProfanityModel` computes it that way (:meth:`ProfanityModel.score`) and
the unit tests compare it with the package's ``predict_prob`` (:func:`score_reference`) on a labelled set.

Category: ``profanity`` (offensive language; ``/v1/moderations`` also reports it as ``harassment``).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from importlib.metadata import version as package_version

from safety.guards.base import Guard, GuardContext, GuardResult


class ProfanityModel:
    """alt-profanity-check's model as plain tables, loaded once from the installed wheel (never downloaded).

    ``score(text) -> float`` in [0, 1]: TF-IDF (raw counts x smoothed idf, l2-normalised, the package's
    English stop words dropped because they are not in its vocabulary), then for each of the k calibrated
    LinearSVCs ``p_i = 1 / (1 + exp(a_i * (w_i . x + b_i) + c_i))`` (Platt scaling), averaged as
    scikit-learn's ``CalibratedClassifierCV`` does."""

    def __init__(self):
        from profanity_check import profanity_check as package  # loads the joblib files once

        vectorizer, model = package.vectorizer, package.model
        self.token = re.compile(vectorizer.token_pattern)
        calibrated = model.calibrated_classifiers_
        self.intercepts = [float(c.estimator.intercept_[0]) for c in calibrated]
        self.calibration = [(float(c.calibrators[0].a_), float(c.calibrators[0].b_)) for c in calibrated]
        weights = [c.estimator.coef_[0] for c in calibrated]
        idf = vectorizer.idf_
        self.table: dict[str, tuple[float, ...]] = {
            term: (float(idf[i]), *(float(w[i]) for w in weights))
            for term, i in vectorizer.vocabulary_.items()
        }
        self.k = len(calibrated)

    def score(self, text: str) -> float:
        table = self.table
        k = self.k
        dots = [0.0] * k
        norm2 = 0.0
        # Counter counts in C; only the distinct words go through the Python loop below.
        for term, count in Counter(self.token.findall(text.lower())).items():
            row = table.get(term)
            if row is None:
                continue
            x = count * row[0]
            norm2 += x * x
            for i in range(k):
                dots[i] += x * row[i + 1]
        scale = 1.0 / math.sqrt(norm2) if norm2 > 0 else 0.0
        total = 0.0
        for i in range(k):
            decision = dots[i] * scale + self.intercepts[i]
            a, b = self.calibration[i]
            total += 1.0 / (1.0 + math.exp(a * decision + b))
        return total / k


def score_reference(texts: list[str]) -> list[float]:
    """The package's own ``predict_prob`` (scikit-learn), the reference :meth:`ProfanityModel.score` is
    tested against."""
    from profanity_check import predict_prob

    return [float(p) for p in predict_prob(texts)]


_model: ProfanityModel | None = None
_model_lock = threading.Lock()


def profanity_model() -> ProfanityModel:
    """The process's one :class:`ProfanityModel` (loaded on first use, ~0.3 s, ~20 MB)."""
    global _model
    if _model is None:
        with _model_lock:
            if _model is None:
                _model = ProfanityModel()
    return _model


class ProfanityGuard(Guard):
    """Scores ``profanity`` with :class:`ProfanityModel` on both stages. Its version is the package's."""

    name = "profanity"

    def __init__(self):
        self.model = profanity_model()
        self.version = f"alt-profanity-check=={package_version('alt-profanity-check')}"

    def check(self, text: str, context: GuardContext) -> GuardResult:
        return GuardResult(
            guard=self.name, version=self.version, scores={"profanity": round(self.model.score(text), 6)}
        )
