#!/usr/bin/env bash
# Build the example repositories, serve them with Naiad and run Triton's example clients against them
# (scripts/triton_examples_corpus.sh), then stop the servers. Fetches nothing: pass checkouts of
# triton-inference-server/client and triton-inference-server/python_backend (branch r24.10).
#
# Usage: triton_examples_corpus_naiad.sh CLIENT_CHECKOUT PYTHON_BACKEND_CHECKOUT IMAGE
# Env:   PYTHON         Python with tritonclient[all] and pillow that runs the clients (default python3)
#        NAIAD_PYTHON   Python with Naiad installed (default python3); onnx and torch make the ONNX
#                       image classifier and the pytorch example available
#        CONTROL_PORT   first of six ports for the two explicit-mode servers (default 28130)
# Needs localhost:8000-8002 free: the python_backend example clients have these addresses built in.
set -u
CLIENT=$(cd "$1" && pwd)/src/python/examples; PB=$(cd "$2" && pwd)/examples; IMAGE=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
NPY=${NAIAD_PYTHON:-python3}; P=${CONTROL_PORT:-28130}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

extras=()
"$NPY" -c 'import onnx' 2>/dev/null && extras+=(--onnx)
"$NPY" -c 'import torch' 2>/dev/null && extras+=(--pytorch)
"$NPY" "$HERE/triton_examples_corpus.py" "$WORK/all" --python-backend-examples "$PB" "${extras[@]}" || exit 1
"$NPY" "$HERE/triton_examples_corpus.py" "$WORK/control7" --client-models-only || exit 1
"$NPY" "$HERE/triton_examples_corpus.py" "$WORK/control8" --client-models-only --onnx || exit 1

serve() {  # serve LOG ARGS...: start `naiad serve` and wait for its ready line
  local log=$1; shift
  "$NPY" -m naiad serve --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 "$@" >"$log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 180); do
    grep -q NAIAD_READY "$log" && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 1
  done
  echo "naiad serve $* did not start:" >&2; tail -n 20 "$log" >&2; exit 1
}
serve "$WORK/all.log" --model-repository "$WORK/all" --http-port 8000 --grpc-port 8001 --metrics-port 8002
serve "$WORK/c7.log" --model-repository "$WORK/control7" --model-control-mode explicit \
  --http-port "$P" --grpc-port $((P + 1)) --metrics-port $((P + 2))
serve "$WORK/c8.log" --model-repository "$WORK/control8" --model-control-mode explicit \
  --http-port $((P + 3)) --grpc-port $((P + 4)) --metrics-port $((P + 5))
bash "$HERE/triton_examples_corpus.sh" "$CLIENT" "$PB" "$IMAGE" "localhost:$P" "localhost:$((P + 4))"
