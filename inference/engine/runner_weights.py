"""How the runner takes a ``transformers`` model's weights: Q/K/V and gate/up fused into one matrix each (the modules
re-pointed at views of it, so memory is not doubled), the loader's GGUF blocks looked up by parameter name, and the
float weights released once the runner holds them in other forms (:class:`~inference.engine.runner.ModelRunner`'s
``release_weights``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import block_quant, memory


def release(linear: Any, loaded: dict[int, torch.Tensor], *modules: Any) -> None:
    """Drop the float weight of ``linear`` (only when it has packed and block forms; ``None``: no runner copy) and
    of the ``transformers`` modules holding it, so its memory is freed; a module's weight becomes empty.

    ``loaded`` maps ``id(module)`` to the weight it was loaded with (before Q/K/V and gate/up were fused): where
    that is a view of the memory-mapped checkpoint, its pages are evicted now rather than when the last view goes
    (:func:`~inference.engine.memory.drop_file_pages`), which keeps the load's peak near the packed model's size.
    """
    if linear is not None:
        if not linear.covered:
            return
        linear.release_weight()  # every call now takes the blocks or a packed copy
    for module in modules:
        module.weight.data = module.weight.data.new_empty(0)
        original = loaded.pop(id(module), None)
        if original is not None:
            memory.drop_file_pages(original)


def own_small_tensors(model: Any) -> None:
    """Copy the model's vectors (norm weights, biases) into memory of their own.

    ``transformers`` loads a safetensors checkpoint as views of one ``mmap`` of the file; while any tensor still
    points into it, every page of the file that was read (all of it, once the weights are packed) stays in the
    process's resident set. With the matrices released, the vectors are the last such views.
    """
    for param in model.parameters():
        if param.dim() < 2:
            param.data = param.data.clone()


def bias_of(linear: Any) -> torch.Tensor | None:
    return linear.bias.data if getattr(linear, "bias", None) is not None else None


def fuse(modules: list[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of several Linear modules along the output dim
    and point the modules at views of the fused tensor so memory is not doubled."""
    weight = torch.cat([m.weight.data for m in modules], dim=0).contiguous()
    has_bias = all(m.bias is not None for m in modules)
    bias = torch.cat([m.bias.data for m in modules], dim=0).contiguous() if has_bias else None
    offset = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight.data = weight[offset : offset + n]
        if has_bias:
            m.bias.data = bias[offset : offset + n]
        offset += n
    return weight, bias


class BlockLookup:
    """The loader's GGUF blocks (``LoadedModel.block_weights``, by parameter name) of a model's modules."""

    def __init__(self, model: Any, given: dict[str, block_quant.BlockWeight] | None) -> None:
        self._names = {id(module): name for name, module in model.named_modules()}
        self._given = given or {}

    def __call__(self, *modules: Any) -> block_quant.BlockWeight | None:
        """The blocks of these modules' weights stacked (a fused projection's parts, in order), or ``None``."""
        parts = [self._given.get(f"{self._names.get(id(m))}.weight") for m in modules]
        if any(p is None for p in parts):
            return None
        try:
            return block_quant.concat(parts)
        except ValueError:  # parts of different kinds
            return None
