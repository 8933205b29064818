"""chatsite inference engine: continuous batching LLM serving on CPU (and CUDA) with plain torch.

Public API (stable; other packages code against it)::

    from inference.engine import LLMEngine, EngineConfig, ModelSpec, SamplingParams
    engine = LLMEngine.from_spec(spec, EngineConfig(), cache_dir)
    handle = engine.submit(engine.render_chat(messages), SamplingParams(temperature=0.7))
    for event in handle.events():   # TokenEvent ... FinishEvent
        ...
    async for event in handle:       # the same, for asyncio consumers (no thread per stream)
        ...

    engine.submit(..., cache_salt="user:42")   # prefix cache namespace (one per user)
    engine.submit(..., token_events=True)      # + a SampledTokenEvent per sampled token
    engine.add_step_listener(fn)               # fn(StepStats) after every step

No Django imports anywhere in this package.
"""

from .config import DEFAULT_MODEL_SPEC, EngineConfig, ModelSpec
from .engine import EngineLoad, LLMEngine
from .errors import EngineError, EngineStopped, InvalidRequest, QueueFull, UnknownModel
from .loader import LoadedModel, load_model, prepare_model, resolve_device
from .request import FinishEvent, RequestHandle, SampledTokenEvent, Timings, TokenEvent, Usage
from .sampling import SamplingParams
from .step_stats import StepStats

__all__ = [
    "DEFAULT_MODEL_SPEC",
    "EngineConfig",
    "EngineError",
    "EngineLoad",
    "EngineStopped",
    "FinishEvent",
    "InvalidRequest",
    "LLMEngine",
    "LoadedModel",
    "ModelSpec",
    "QueueFull",
    "RequestHandle",
    "SampledTokenEvent",
    "SamplingParams",
    "StepStats",
    "Timings",
    "TokenEvent",
    "UnknownModel",
    "Usage",
    "load_model",
    "prepare_model",
    "resolve_device",
]
