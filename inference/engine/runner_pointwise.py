"""The runner's element-wise operations, as a mixin of :class:`~inference.engine.runner.ModelRunner`: RMSNorm (alone
and after the residual add), RoPE with the K/V cache writes, and the greedy argmax, each the kernel registry's choice
made once at load time (the native kernel of ``elementwise.c`` / ``rope_cache.c``, or torch's ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import kernels
from .kernels import registry


def pick(op: str, dtype: torch.dtype, native: bool, builds: dict[str, Any]) -> tuple[str, Any]:
    """The registry's choice for an op that has one implementation for all row counts: ``(name, builds[name])``."""
    bands = registry.choose(op, dtype, lambda entry: builds.get(entry.name) or None, native=native)
    return bands[0][1].name, bands[0][2]


class PointwiseMixin:
    """RMSNorm, RoPE, argmax and sampling for :class:`~inference.engine.runner.ModelRunner` (which sets ``dtype``,
    ``eps`` and ``elementwise`` before calling :meth:`_choose_pointwise`)."""

    dtype: torch.dtype
    eps: float
    elementwise: kernels.Elementwise | None

    def _choose_pointwise(self, native: bool, hidden: int) -> None:
        """RMSNorm (alone and after the residual add), RoPE with the K/V cache writes and the greedy argmax: the
        registry's choice, once (the native kernel or torch's ops)."""
        el, eps, shape = self.elementwise, self.eps, (hidden,)

        def torch_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            # LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in float32, cast back, then the weight multiply in the model
            # dtype. F.rms_norm without weight is the same float32 math in one kernel (bit-identical; checked by
            # test_runner_matches_hf_modules). The native kernel does the same math in one pass, summing the squares
            # in another order.
            return weight * F.rms_norm(x.float(), shape, eps=eps).to(x.dtype)

        def torch_add_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            x[: delta.shape[0]].add_(delta)
            return self._norm(x, weight)

        native_norm = el and (lambda x, weight: el.rms_norm(x, weight, eps))
        native_add = el and (lambda x, delta, weight: el.add_rms_norm(x, delta, weight, eps))
        self._norm: Callable[..., torch.Tensor]
        _, self._norm = pick("rms_norm", self.dtype, native, {"rms_norm": native_norm, "torch": torch_norm})
        _, self._add_norm = pick(
            "add_rms_norm", self.dtype, native, {"add_rms_norm": native_add, "torch": torch_add_norm}
        )
        rope = kernels.rope_cache() if native else None
        name, fn = pick("rope_cache", self.dtype, native, {"rope_cache": rope, "torch": "torch"})
        #: RoPE with the K/V written into the cache in one native pass; ``None``: torch's ops and ``index_copy_``.
        self.rope_cache = fn if name == "rope_cache" else None
        name, fn = pick("argmax", self.dtype, native, {"argmax": el and el.argmax, "torch": "torch"})
        #: The greedy argmax of the logits (``[R, V] -> [R]``) when the native kernel is chosen, else ``None``.
        self.argmax = fn if name == "argmax" else None
        sampler = kernels.top_p_sampler() if native else None
        name, fn = pick(
            "sample_top_p", self.dtype, native, {"sample_top_p": sampler and sampler.sample, "torch": "torch"}
        )
        #: Temperature / top-k / top-p sampling of the logits' sampled rows when the native kernel is chosen
        #: (:data:`inference.engine.sampling.NativeSampler`), else ``None``.
        self.sampler = fn if name == "sample_top_p" else None

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """LlamaRMSNorm of ``x`` ``[rows, dim]``: the registry's choice (:meth:`_choose_pointwise`)."""
        return self._norm(x, weight)

    def _add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor
    ) -> torch.Tensor:
        """``x[:len(delta)] += delta`` in place (the residual add; ``None``: nothing to add), then ``_rms_norm(x)``:
        one native pass when the registry chose the kernel."""
        if delta is None:
            return self._norm(x, weight)
        return self._add_norm(x, delta, weight)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        # HF: x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1). Here the halves
        # are swapped with one flip and the minus sign lives in sin_signed = cat(-sin1, sin2);
        # (-a) * b == a * (-b) exactly, so the result is bit-identical.
        half = x.shape[-1] // 2
        swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
        return (x * cos) + (swapped * sin_signed)
