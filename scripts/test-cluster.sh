#!/usr/bin/env bash
# `make test-cluster` (called by .ci/run after make test and make test-vllm): the multi-host test bed's drills
# (tests/cluster, docs/scale-out.md) and the container image's build and run (tests/cluster/test_container.py).
# Needs root; installs Debian's haproxy, iptables, chromium, podman, runc and debootstrap if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DJANGO_SETTINGS_MODULE=chatsite.settings.test
missing=()
for tool in haproxy iptables chromium podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python manage.py prepare_model
CHATSITE_BED_TESTS=1 python -m pytest tests/cluster -m cluster -v -s "$@"
