"""Blue-green rollout state: which share of a model's replies goes to a candidate version."""

from django.core.validators import MaxValueValidator
from django.db import models


class ModelRollout(models.Model):
    """One row per registered model name under rollout.

    ``percent`` of new replies (0..100) go to ``candidate_version``, the rest to ``stable_version``, spread
    evenly over consecutive replies (``inference.rollout.takes_candidate``). Set with
    ``manage.py rollout``."""

    model_name = models.CharField(max_length=100, unique=True)
    stable_version = models.CharField(max_length=64, blank=True, default="")
    candidate_version = models.CharField(max_length=64)
    percent = models.PositiveSmallIntegerField(validators=[MaxValueValidator(100)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # The table keeps the name it was created under when the model lived in ``observability``
        # (moved by state-only migrations: inference 0001, observability 0002).
        db_table = "observability_modelrollout"

    def __str__(self) -> str:
        return f"{self.model_name}: {self.percent}% -> {self.candidate_version} (rest {self.stable_version or '-'})"
