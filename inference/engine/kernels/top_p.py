"""The sampling kernel's ctypes binding: :class:`TopPSampler` (``sampling.c``: temperature, top-k and top-p sampling of
one token per logits row). Built and loaded with the other kernels by :mod:`inference.engine.kernels.build`.
"""

from __future__ import annotations

import ctypes

import torch

#: Candidates a row may keep in the native kernel (``SAMPLE_MAX_CAND`` in ``sampling.c``).
MAX_CANDIDATES = 1024


class TopPSampler:
    """``sampling.c`` bound with ctypes: one draw per row of float32 logits from the temperature-scaled softmax cut to
    top-k, then top-p (nucleus sampling, Holtzman et al., ICLR 2020), by inverse CDF over the candidates sorted by
    logit, the torch path's draw (:func:`inference.engine.sampling._sample_rows`) in two vectorised passes and a
    heap scan per row.

    Raises:
        ValueError: a dtype, shape or layout the kernel does not take.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.sample_top_p_f32
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4
        self._fn.argtypes += [ctypes.c_int64, ctypes.c_void_p]

    def sample(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        uniforms: torch.Tensor,
        candidates: int,
    ) -> torch.Tensor:
        """One token id per row of ``logits`` ``[R, V]`` (contiguous float32, unchanged).

        Args:
            temperature: ``[R]`` float32, each ``> 0``.
            top_k: ``[R]`` int64, ``0`` (or ``>= V``) for none.
            top_p: ``[R]`` float32 in ``(0, 1]``; ``1`` with no top-k draws from the whole softmax.
            uniforms: ``[R]`` float32 in ``[0, 1)``, the row's draw.
            candidates: logits kept per row for top-p without top-k (at most :data:`MAX_CANDIDATES`).

        Returns:
            ``[R]`` int64 token ids; ``-1`` for a row the candidates cannot decide (top-p without top-k whose
            ``candidates`` largest hold less than ``top_p`` of the mass, top-k above :data:`MAX_CANDIDATES`, or a
            non-finite maximum): the caller samples that row another way.
        """
        rows = logits.shape[0] if logits.dim() == 2 else -1
        vectors = (temperature, top_p, uniforms)
        if (
            logits.dim() != 2
            or logits.dtype != torch.float32
            or not logits.is_contiguous()
            or logits.device.type != "cpu"
            or any(v.shape != (rows,) or v.dtype != torch.float32 for v in vectors)
            or top_k.shape != (rows,)
            or top_k.dtype != torch.int64
            or not 1 <= candidates <= MAX_CANDIDATES
        ):
            raise ValueError("sample_top_p: unsupported dtype, shape or layout")
        inv_temp = (1.0 / temperature).contiguous()
        top_k, top_p, uniforms = top_k.contiguous(), top_p.contiguous(), uniforms.contiguous()
        out = torch.empty(rows, dtype=torch.int64)
        self._fn(
            logits.data_ptr(),
            rows,
            logits.shape[1],
            inv_temp.data_ptr(),
            top_k.data_ptr(),
            top_p.data_ptr(),
            uniforms.data_ptr(),
            candidates,
            out.data_ptr(),
        )
        return out
