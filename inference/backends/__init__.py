"""Serving backends of a worker: one interface (:mod:`.base`), the native engine (:mod:`.native`) and vLLM as a
library (:mod:`.vllm`), chosen once per worker from the model registry (:mod:`.build`)."""

from inference.backends.base import BACKENDS, EngineDead, ReplyStream, ServingEngine

__all__ = ["BACKENDS", "EngineDead", "ReplyStream", "ServingEngine"]
