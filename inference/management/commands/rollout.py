"""``manage.py rollout MODEL --to VERSION --percent P``: shift a share of a model's replies to a version."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from inference import fleet
from inference.rollout import rollout_clear, rollout_set


class Command(BaseCommand):
    help = (
        "Blue-green rollout: send PERCENT %% of MODEL's new replies to VERSION (the rest to the stable version). "
        "--percent 100 finishes the shift, --percent 0 sends everything back, --clear ends the rollout."
    )

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument("--to", dest="version", help="candidate version")
        parser.add_argument("--percent", type=int, help="0..100")
        parser.add_argument(
            "--stable", help="stable version (default: the registry's, or the rollout's current)"
        )
        parser.add_argument("--clear", action="store_true", help="end the rollout (replies go to any worker)")

    def handle(self, *args, model, version, percent, stable, clear, **options):
        if clear:
            self.stdout.write("rollout cleared" if rollout_clear(model_name=model) else "no rollout to clear")
            return
        if version is None or percent is None:
            raise CommandError("--to VERSION and --percent P are required (or --clear)")
        try:
            rollout = rollout_set(
                model_name=model, to_version=version, percent=percent, stable_version=stable
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"rollout {rollout}")
        for warning in self.missing_workers(model, rollout):
            self.stderr.write(warning)

    @staticmethod
    def missing_workers(model: str, rollout) -> list[str]:
        """Warnings for versions that get traffic but have no live worker (their replies would wait)."""
        serving = {w.model_version for w in fleet.live_workers() if w.model == model and not w.draining}
        wanted = []
        if rollout.percent > 0:
            wanted.append(rollout.candidate_version)
        if rollout.percent < 100:
            wanted.append(rollout.stable_version)
        return [
            f"warning: no live worker serves {model}@{v or '(unversioned)'}"
            for v in wanted
            if v not in serving
        ]
