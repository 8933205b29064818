"""A tiny random-weight Llama with the product's tokenizer and chat template, for database-layer tests that run
the real engine and worker adapter (``conversations.reply_runner.run_generation``) without loading real weights."""

from pathlib import Path

from django.conf import settings


def model_dir() -> Path:
    """The prepared default model's directory (``MODEL_CACHE_DIR``), whose tokenizer and template are reused."""
    return Path(settings.MODEL_CACHE_DIR) / "smollm2-135m-instruct"


def tiny_loaded_model():
    """A :class:`~inference.engine.LoadedModel` (2 layers, hidden 64, float32, CPU, context 1024 tokens)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from inference.engine import LoadedModel, ModelSpec

    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    spec = ModelSpec(name="tiny", source="memory", dtype="float32", context_length=1024)
    return LoadedModel(
        model=LlamaForCausalLM(config).eval(),
        tokenizer=tokenizer,
        spec=spec,
        device=torch.device("cpu"),
        dtype=torch.float32,
        eos_token_ids=(2,),
    )
