"""The registry's tables: every implementation of every op the runner performs (:data:`KERNELS`) and the times
measured between them per CPU kind (:data:`MEASURED`). :mod:`.registry` chooses from them; ``docs/engine-kernels.md``
shows the choice per CPU kind and the figures behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: Weight forms, fewest bytes first: GGUF blocks (~5 or ~8.5 bits a weight), a packed copy, the float weight itself.
FORMS = ("blocks", "packed", "float", "none")

F32, BF16 = torch.float32, torch.bfloat16
AMX = ("amx_tile", "amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class Kernel:
    """One implementation of one operation.

    Attributes:
        op: The operation (``"linear"``, ``"gated_up"``, ``"decode_attention"``, ``"prefill_attention"``,
            ``"rms_norm"``, ``"add_rms_norm"``, ``"silu_mul"``, ``"rope_cache"``, ``"argmax"``).
        name: Unique within the op; ``"torch"`` is the op's reference.
        source: Where the code is (a file of :mod:`inference.engine.kernels`, or the torch op).
        features: CPU feature flags it needs, all of them (``/proc/cpuinfo`` names).
        dtypes: The model dtypes it takes.
        shapes: What shapes it takes, in words (the binding's ``supports`` checks them when the layer is built).
        priority: Higher wins where nothing was measured.
        reference: The implementation of the same op it is tested against.
        max_rows: The most rows (tokens of a step; chunk tokens for prefill attention) it is used for, per dtype;
            a dtype absent: any number.
        form: How it holds a linear weight (:data:`FORMS`): what choosing it costs in memory.
        native: Used only with ``EngineConfig.native_kernels`` (the switch that keeps torch's ops everywhere).
        library: Needs the built native library (:func:`inference.engine.kernels.build.library`).
        avoid: CPU features under which it is not used although it could run (``why_avoided`` says why).
        why_avoided: The reason, for :func:`~inference.engine.kernels.registry.unavailable`.
    """

    op: str
    name: str
    source: str
    features: tuple[str, ...] = ()
    dtypes: tuple[torch.dtype, ...] = (F32, BF16)
    shapes: str = "any"
    priority: int = 50
    reference: str = "torch"
    max_rows: dict[torch.dtype, int] = field(default_factory=dict)
    form: str = "none"
    native: bool = True
    library: bool = True
    avoid: tuple[str, ...] = ()
    why_avoided: str = ""

    def rows_limit(self, dtype: torch.dtype) -> int | None:
        """The most rows it is used for in ``dtype``; ``None``: any."""
        return self.max_rows.get(dtype)


def _torch(op: str, source: str, form: str = "none") -> Kernel:
    """The op's reference: plain torch, runs everywhere (vLLM's ``forward_native``)."""
    return Kernel(op, "torch", source, priority=0, form=form, native=False, library=False)


_NOT_ON_AMX = (
    "oneDNN's bf16 matmuls run on the AMX tiles there: 32 rows of the default model's projections 16.3 ms against "
    "this kernel's 40 (2-vCPU Xeon with AMX, README Performance round 12)"
)

# One entry per line or two: a table is read across, so ruff's formatter is kept off it.
# fmt: off
#: Every implementation of every op.
KERNELS: tuple[Kernel, ...] = (
    # ---- linear: y = x @ W.T + b, [m, k] -> [m, n]. Row limits, measured (README, Performance): linear_rows 1 (2
    # cores, AVX512-BF16, the default model's projections: a one-row step 18 ms against oneDNN's 26, level from 2 rows;
    # round 5); linear_blocks 8 in float32 (round 6), 1 in bf16 (oneDNN's bf16 kernel as fast from two rows: 2-vCPU
    # Xeon, 18.2 ms a step against 18.0); linear_amx 64 (2-vCPU Xeon with AMX, round 12; one row: linear_blocks).
    Kernel("linear", "linear_blocks", "linear_blocks.c", shapes="GGUF Q4_1/Q8_0 blocks of the weight",
           priority=100, max_rows={F32: 8, BF16: 1}, form="blocks"),
    Kernel("linear", "linear_rows", "linear_rows.c", shapes="k % 16 == 0", priority=90,
           max_rows={F32: 1, BF16: 1}, form="float"),
    Kernel("linear", "linear_amx", "linear_amx.c", features=AMX, dtypes=(BF16,), shapes="GGUF blocks, n % 16 == 0",
           priority=80, max_rows={BF16: 64}, form="blocks"),
    Kernel("linear", "linear_fma_blocks", "linear_fma.c", features=("avx2", "fma"), dtypes=(F32,),
           shapes="GGUF Q8_0/Q4_1 blocks, n % panel == 0 (panel 8 on AVX2, 16 on AVX-512)", priority=70,
           form="blocks"),
    Kernel("linear", "linear_fma", "linear_fma.c", features=("avx2", "fma"), dtypes=(F32,),
           shapes="n % panel == 0", priority=60, form="packed"),
    Kernel("linear", "linear_vnni", "linear_vnni.c", features=("avx512f", "avx512_bf16"), dtypes=(BF16,),
           shapes="n % 16 == 0, k even", priority=60, form="packed", avoid=("amx_tile",), why_avoided=_NOT_ON_AMX),
    Kernel("linear", "onednn", "torch.ops.mkldnn._linear_pointwise (weight reordered once)", priority=20,
           form="packed", native=False, library=False),
    _torch("linear", "torch.nn.functional.linear", form="float"),
    # ---- gated_up: silu(x @ Wg.T) * (x @ Wu.T), [m, k] -> [m, I], from the fused [gate; up] weight. A step the
    # few-rows linear kernels take runs them, then silu_mul: they read each weight once at memory bandwidth, so a
    # fused pass has nothing to save there. The fused kernels take no bias.
    Kernel("gated_up", "blocks_silu_mul", "linear_blocks.c, then elementwise.c", shapes="as linear_blocks",
           priority=110, max_rows={F32: 8, BF16: 1}, form="blocks"),
    Kernel("gated_up", "rows_silu_mul", "linear_rows.c, then elementwise.c", shapes="as linear_rows",
           priority=105, max_rows={F32: 1, BF16: 1}, form="float"),
    Kernel("gated_up", "linear_amx_swiglu", "linear_amx.c", features=AMX, dtypes=(BF16,),
           shapes="GGUF blocks, 2I % 32 == 0", priority=80, max_rows={BF16: 64}, form="blocks"),
    Kernel("gated_up", "linear_fma_blocks_swiglu", "linear_fma.c", features=("avx2", "fma"), dtypes=(F32,),
           shapes="GGUF Q4_1 blocks, 2I % (2 panel) == 0", priority=70, form="blocks"),
    Kernel("gated_up", "linear_fma_swiglu", "linear_fma.c", features=("avx2", "fma"), dtypes=(F32,),
           shapes="2I % (2 panel) == 0", priority=60, form="packed"),
    Kernel("gated_up", "linear_vnni_swiglu", "linear_vnni.c", features=("avx512f", "avx512_bf16"), dtypes=(BF16,),
           shapes="2I % 32 == 0", priority=60, form="packed", avoid=("amx_tile",), why_avoided=_NOT_ON_AMX),
    Kernel("gated_up", "onednn_swiglu", "torch.ops.mkldnn._linear_pointwise with swish and mul post-ops",
           dtypes=(BF16,), priority=20, form="packed", library=False),
    Kernel("gated_up", "unfused", "the linear op's choice, then the silu_mul op's", priority=1, form="packed",
           native=False, library=False),
    _torch("gated_up", "torch.nn.functional.silu(x @ Wg.T) * (x @ Wu.T)", form="float"),
    # ---- attention (rows: a prefill chunk's tokens)
    Kernel("decode_attention", "decode_attention", "decode_attention.c",
           shapes="head size % 16 == 0 and <= 256, 1-8 query heads per KV head"),
    _torch("decode_attention", "torch.nn.functional.scaled_dot_product_attention"),
    Kernel("prefill_attention", "prefill_attention_amx", "prefill_attention_bf16.c (products on AMX tiles)",
           features=AMX, dtypes=(BF16,), shapes="head size 64, 1-8 query heads per KV head", priority=60),
    Kernel("prefill_attention", "prefill_attention", "prefill_attention.c (bf16: prefill_attention_bf16.c)",
           shapes="head size % 16 == 0 and <= 256, 1-8 query heads per KV head"),
    Kernel("prefill_attention", "sdpa_gqa", "torch SDPA with enable_gqa (oneDNN's brgemm on AMX tiles)",
           features=("amx_tile", "amx_bf16"), dtypes=(BF16,), priority=10, library=False),
    _torch("prefill_attention", "torch.nn.functional.scaled_dot_product_attention, one call per chunk"),
    # ---- norms, activation, RoPE, sampling
    Kernel("rms_norm", "rms_norm", "elementwise.c", shapes="[rows, dim] contiguous"),
    _torch("rms_norm", "torch.nn.functional.rms_norm in float32, LlamaRMSNorm's order"),
    Kernel("add_rms_norm", "add_rms_norm", "elementwise.c", shapes="[rows, dim] contiguous"),
    _torch("add_rms_norm", "Tensor.add_, then rms_norm"),
    Kernel("silu_mul", "silu_mul", "elementwise.c", shapes="[rows, 2I] contiguous"),
    _torch("silu_mul", "torch.nn.functional.silu(gate) * up"),
    Kernel("rope_cache", "rope_cache", "rope_cache.c", shapes="even head size"),
    _torch("rope_cache", "x * cos + rotate_half(x) * sin, then index_copy_ into the cache"),
    Kernel("argmax", "argmax", "elementwise.c", shapes="[rows, n] contiguous"),
    _torch("argmax", "torch.argmax(-1)"),
    Kernel("sample_top_p", "sample_top_p", "sampling.c", shapes="float32 logits [rows, vocab] contiguous"),
    _torch("sample_top_p", "torch.topk(256), logsumexp and cumsum (sampling._sample_rows_torch)"),
)
# fmt: on


@dataclass(frozen=True)
class Measurement:
    """Times of an op's implementations against each other on one CPU kind and dtype, for a band of row counts.

    Attributes:
        kind: The CPU kind (:func:`~inference.engine.kernels.registry.cpu_kind`).
        dtype: The model dtype.
        op: The operation.
        rows: The band of row counts (tokens of a step; chunk tokens for prefill attention) the figures decide,
            ``(first, last)``, ``last`` ``None`` for unbounded.
        ms: Milliseconds by implementation name (medians).
        what: What was timed, on which machine, when, and how.
    """

    kind: str
    dtype: torch.dtype
    op: str
    rows: tuple[int, int | None]
    ms: dict[str, float]
    what: str


# fmt: off
#: The measured table. Each figure names what was timed, the machine and the date; docs/engine-kernels.md repeats them.
MEASURED: tuple[Measurement, ...] = (
    # Zen 3: the whole engine, default model, N=32 decode (ms a step from tok/s): GGUF blocks 123 tok/s against the
    # float path's 150-165 (mid 157).
    Measurement("x86-avx2", F32, "linear", (9, None),
                {"linear_fma_blocks": 1000 * 32 / 123, "linear_fma": 1000 * 32 / 157},
                "engine decode step at N=32, default model, from tok/s: 2-vCPU AMD EPYC (Zen 3), 2026-11-25"),
    Measurement("x86-avx2", F32, "gated_up", (9, None),
                {"linear_fma_blocks_swiglu": 1000 * 32 / 123, "linear_fma_swiglu": 1000 * 32 / 157},
                "the same runs (gate/up changes form with the other projections)"),
    # AMX Xeon, bf16 prefill attention, one layer of the default model: a 1500-token prompt 3.5 ms in the native
    # kernel on the tiles (head size 64), 5.0 in torch's SDPA, 15.7 in the kernel's AVX-512 dot products (what other
    # head sizes get); 32 chunks of 16 tokens 0.5 in the kernel against 1.0 in SDPA (its per-call cost).
    Measurement("x86-avx512-amx", BF16, "linear", (2, 64), {"linear_amx": 12.2, "onednn": 18.9},
                "the default model's projections at 32 rows: 2-vCPU Xeon with AMX, 2026-11-24 (round 12)"),
    Measurement("x86-avx512-amx", BF16, "prefill_attention", (32, None),
                {"prefill_attention_amx": 3.5, "sdpa_gqa": 5.0, "prefill_attention": 15.7},
                "one layer's attention of a 1500-token prompt: 2-vCPU Xeon with AMX, 2026-11-24"),
    Measurement("x86-avx512-amx", BF16, "prefill_attention", (1, 31),
                {"prefill_attention": 0.5, "sdpa_gqa": 1.0},
                "one layer, 32 chunks of 16 tokens: 2-vCPU Xeon with AMX, 2026-11-24"),
)
# fmt: on
