"""Inference benchmark for chatsite: ``python -m devtools.bench``.

Compares, on the same model, machine, dtype and process run, four ways of serving the same requests:

* ``naive``  -- ``model.generate`` one request at a time, FIFO (the usual one-request-per-call server).
* ``static`` -- static batching: ``model.generate`` on left-padded batches collected over a short window;
  a batch runs until its longest reply is done before the next batch starts.
* ``hf_cb``  -- transformers' built-in continuous batching manager
  (``transformers.generation.continuous_batching``).
* ``ours``   -- chatsite's continuous-batching engine (``inference.engine.LLMEngine``).

Continuous (iteration-level) batching follows Orca (Yu et al., OSDI'22); paged KV cache and the
metrics conventions (TTFT, inter-token latency, output tok/s) follow vLLM (Kwon et al., SOSP'23) and its
``benchmark_serving`` script.

Units used throughout: times in milliseconds (ms) unless the name ends in ``_s``, throughput in output
tokens per second (tok/s), memory in MB (10**6 bytes), bandwidth in GB/s (10**9 bytes per second).
"""
