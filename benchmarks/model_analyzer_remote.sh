#!/usr/bin/env bash
# NVIDIA's Model Analyzer in remote mode against a running Naiad: it loads each config variant
# through the repository API (explicit mode) and profiles it with perf_analyzer, over gRPC and HTTP.
#
# Usage: benchmarks/model_analyzer_remote.sh [OUT_DIR]   (default: ./model-analyzer-results)
# Env:   MODEL_ANALYZER  the model-analyzer command (default: model-analyzer on PATH), e.g. from
#                        `python -m venv ma-venv && ma-venv/bin/pip install triton-model-analyzer`
#        PERF_ANALYZER   perf_analyzer 2.60 (default: perf_analyzer on PATH)
#        NAIAD_PYTHON    Python with Naiad installed (default: .venv/bin/python of this checkout)
# Model Analyzer writes every variant as KIND_GPU unless told `cpu_only`, which a CPU-only server
# refuses (as Triton does): the profile file below sets it. Results: OUT_DIR/<protocol>/results/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
OUT=$(mkdir -p "${1:-model-analyzer-results}" && cd "${1:-model-analyzer-results}" && pwd)
MA=${MODEL_ANALYZER:-model-analyzer}
PA=${PERF_ANALYZER:-$(command -v perf_analyzer || true)}
PY=${NAIAD_PYTHON:-$ROOT/.venv/bin/python}
[ -n "$PA" ] || { echo "perf_analyzer not found: set PERF_ANALYZER" >&2; exit 2; }
command -v "$MA" >/dev/null || { echo "model-analyzer not found: set MODEL_ANALYZER" >&2; exit 2; }

WORK=$(mktemp -d)
SERVER=""
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# perf_analyzer must be callable by that name: Model Analyzer runs `perf_analyzer`.
mkdir -p "$WORK/bin" && ln -s "$PA" "$WORK/bin/perf_analyzer"
export PATH="$WORK/bin:$PATH"

"$PY" "$ROOT/examples/generate_models.py" --output "$WORK/models" >/dev/null
"$PY" -m naiad serve --model-repository "$WORK/models" --model-control-mode explicit --load-model add_sub \
    --http-address 127.0.0.1 --http-port 0 --grpc-address 127.0.0.1 --grpc-port 0 \
    --metrics-address 127.0.0.1 --metrics-port 0 >"$WORK/naiad.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do grep -q NAIAD_READY "$WORK/naiad.log" && break; sleep 0.5; done
ready=$(grep -o 'NAIAD_READY {.*}' "$WORK/naiad.log") || { tail -20 "$WORK/naiad.log" >&2; exit 1; }
port() { echo "$ready" | "$PY" -c "import json,sys; print(json.loads(sys.stdin.read().split(' ',1)[1])['$1'])"; }
HTTP=$(port http_port); GRPC=$(port grpc_port); METRICS=$(port metrics_port)

cat >"$WORK/profile.yaml" <<'YAML'
profile_models:
  add_sub:
    cpu_only: true
run_config_search_max_concurrency: 2
run_config_search_max_instance_count: 2
run_config_search_max_model_batch_size: 2
YAML

for protocol in grpc http; do
  rm -rf "$OUT/$protocol"
  "$MA" profile -f "$WORK/profile.yaml" -m "$WORK/models" --triton-launch-mode remote \
      --triton-http-endpoint "127.0.0.1:$HTTP" --triton-grpc-endpoint "127.0.0.1:$GRPC" \
      --triton-metrics-url "http://127.0.0.1:$METRICS/metrics" --client-protocol "$protocol" \
      --output-model-repository-path "$WORK/variants-$protocol" --override-output-model-repository \
      --checkpoint-directory "$WORK/ckpt-$protocol" --export-path "$OUT/$protocol" \
      >"$OUT/$protocol.log" 2>&1 || { echo "model-analyzer ($protocol) failed:" >&2; tail -20 "$OUT/$protocol.log" >&2; exit 1; }
  echo "== $protocol: $OUT/$protocol/results/metrics-model-inference.csv"
  cat "$OUT/$protocol/results/metrics-model-inference.csv"
done
