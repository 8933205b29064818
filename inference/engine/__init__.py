"""chatsite inference engine: continuous batching LLM serving on CPU (and CUDA) with plain torch.

Public API (stable; other packages code against it)::

    from inference.engine import LLMEngine, EngineConfig, ModelSpec, SamplingParams
    engine = LLMEngine.from_spec(spec, EngineConfig(), cache_dir)
    handle = engine.submit(engine.render_chat(messages), SamplingParams(temperature=0.7))
    for event in handle.events():   # TokenEvent ... FinishEvent
        ...

No Django imports anywhere in this package.
"""

from .config import DEFAULT_MODEL_SPEC, EngineConfig, ModelSpec
from .engine import EngineLoad, LLMEngine
from .errors import EngineError, EngineStopped, InvalidRequest, QueueFull, UnknownModel
from .loader import LoadedModel, load_model, prepare_model, resolve_device
from .request import FinishEvent, RequestHandle, Timings, TokenEvent, Usage
from .sampling import SamplingParams

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
    "SamplingParams",
    "Timings",
    "TokenEvent",
    "UnknownModel",
    "Usage",
    "load_model",
    "prepare_model",
    "resolve_device",
]
