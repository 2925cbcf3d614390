#!/usr/bin/env bash
# Start the REAL NVIDIA Triton 2.51 (from the nvidia-pytriton==0.7.0 wheel) with the Python backend.
# Usage: start_triton.sh REPO_DIR HTTP_PORT GRPC_PORT METRICS_PORT [extra tritonserver flags...]
# Env:   TRITON_VENV (default: .venv-triton in the checkout). Runs tritonserver in the foreground (exec);
#        background it yourself:  start_triton.sh repo 18000 18001 18002 >log 2>&1 &
# One-time setup (done by this script if missing):
#   python3 -m venv "$TRITON_VENV"
#   "$TRITON_VENV"/bin/pip install nvidia-pytriton==0.7.0 'tritonclient[http,grpc]' numpy onnxruntime==1.31.1
# (onnxruntime: the benchmarks' Triton model.py files run the same ONNX files as Naiad.)
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 REPO_DIR HTTP_PORT GRPC_PORT METRICS_PORT [extra flags...]" >&2; exit 2
fi
REPO=$1; HTTP=$2; GRPC=$3; METRICS=$4; shift 4
VENV=${TRITON_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv-triton}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import onnxruntime, pytriton' 2>/dev/null; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q nvidia-pytriton==0.7.0 'tritonclient[http,grpc]' numpy onnxruntime==1.31.1
fi
SP=$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
TS="$SP/pytriton/tritonserver"
PYVER=$("$VENV/bin/python" -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
STUB_SRC="$TS/python_backend_stubs/$PYVER/triton_python_backend_stub"
STUB_DST="$TS/backends/python/triton_python_backend_stub"
if [ ! -x "$STUB_DST" ] || ! cmp -s "$STUB_SRC" "$STUB_DST"; then
  cp "$STUB_SRC" "$STUB_DST"; chmod +x "$STUB_DST"
fi
export LD_LIBRARY_PATH="$SP/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$VENV/bin:$PATH"
exec "$TS/bin/tritonserver" --model-repository "$REPO" --backend-directory "$TS/backends" \
  --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \
  --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS" "$@"
