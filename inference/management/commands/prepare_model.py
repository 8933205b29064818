"""``manage.py prepare_model [NAME ...]``: convert each model's weights once into the local cache.

The default model ships as a 4-bit GGUF file; dequantizing it takes ~20 s on two cores, so the converted
safetensors copy under ``MODEL_CACHE_DIR`` is what workers load afterwards. Idempotent.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine import EngineError, prepare_model
from inference.registry import model_spec


class Command(BaseCommand):
    help = "Convert the registered models (default: the default model) into the local cache."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", help="model names from INFERENCE_MODELS")

    def handle(self, *args, names, **options):
        for name in names or [settings.INFERENCE_DEFAULT_MODEL]:
            try:
                path = prepare_model(model_spec(name), settings.MODEL_CACHE_DIR)
            except EngineError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"{name}: ready at {path}")
