#!/usr/bin/env bash
# Run Triton's public example clients, unchanged, against a server already serving the repository that
# scripts/triton_examples_corpus.py builds, and print one PASS/FAIL line per run.
#
# Usage: triton_examples_corpus.sh CLIENT_EXAMPLES_DIR PYTHON_BACKEND_EXAMPLES_DIR IMAGE [CONTROL_HTTP CONTROL_GRPC]
#   CLIENT_EXAMPLES_DIR          a checkout of triton-inference-server/client's src/python/examples (r24.10)
#   PYTHON_BACKEND_EXAMPLES_DIR  a checkout of triton-inference-server/python_backend's examples (r24.10)
#   IMAGE                        any JPEG/PNG for image_client.py
#   CONTROL_HTTP/CONTROL_GRPC    host:port of servers in explicit model-control mode whose repository index
#                                holds 7 (HTTP) and 8 (gRPC) models, as the model_control examples count them
#                                (triton_examples_corpus.py --client-models-only [--onnx]); omitted: skipped
# Env: PYTHON (a Python with tritonclient[all] and pillow; default python3), TIMEOUT (seconds per run, default 60).
# The server must listen on localhost:8000 (HTTP), :8001 (gRPC) and :8002 (metrics): the python_backend
# example clients have these addresses built in.
set -u
CLIENT=$1; PB=$2; IMAGE=$3; CTL_HTTP=${4:-}; CTL_GRPC=${5:-}
PY=${PYTHON:-python3}; LIMIT=${TIMEOUT:-60}
H=localhost:8000; G=localhost:8001
pass=0; fail=0

run() {  # run LABEL DIR SCRIPT ARGS...: PASS when the script exits 0 and, if it can print "PASS", did
  local label=$1 dir=$2; shift 2
  local out rc
  out=$(cd "$dir" && timeout "$LIMIT" "$PY" "$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q 'print("PASS' "$dir/$1" && ! printf '%s' "$out" | grep -q PASS; then
    rc="0 without PASS"
  fi
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1)); printf 'PASS  %s\n' "$label"
  else
    local tail_lines
    tail_lines=$(printf '%s' "$out" | grep -v '^\s*$' | tail -n 3 | tr '\n' ' ' | cut -c1-400)
    fail=$((fail + 1)); printf 'FAIL  %s (rc=%s): %s\n' "$label" "$rc" "${tail_lines:-(no output)}"
  fi
}

C=$CLIENT
for proto in http grpc; do
  url=$H; [ $proto = grpc ] && url=$G
  run "${proto} infer" "$C" simple_${proto}_infer_client.py -u $url
  run "${proto} async" "$C" simple_${proto}_async_infer_client.py -u $url
  run "${proto} aio" "$C" simple_${proto}_aio_infer_client.py -u $url
  run "${proto} string" "$C" simple_${proto}_string_infer_client.py -u $url
  run "${proto} shm" "$C" simple_${proto}_shm_client.py -u $url
  run "${proto} shm_string" "$C" simple_${proto}_shm_string_client.py -u $url
  run "${proto} sequence_sync" "$C" simple_${proto}_sequence_sync_infer_client.py -u $url
  run "${proto} sequence_sync -d" "$C" simple_${proto}_sequence_sync_infer_client.py -u $url -d
  run "${proto} health_metadata" "$C" simple_${proto}_health_metadata.py -u $url
  run "${proto} reuse_infer_objects" "$C" reuse_infer_objects_client.py -i $proto -u $url
  run "${proto} image_client" "$C" image_client.py -i $proto -u $url -m densenet_onnx -c 3 -s INCEPTION "$IMAGE"
  if [ -n "$CTL_HTTP" ]; then
    ctl=$CTL_HTTP; [ $proto = grpc ] && ctl=$CTL_GRPC
    run "${proto} model_control" "$C" simple_${proto}_model_control.py -u $ctl
  fi
done
run "grpc sequence_stream" "$C" simple_grpc_sequence_stream_infer_client.py -u $G
run "grpc sequence_stream -d" "$C" simple_grpc_sequence_stream_infer_client.py -u $G -d
run "grpc aio sequence_stream" "$C" simple_grpc_aio_sequence_stream_infer_client.py -u $G
run "grpc aio sequence_stream -d" "$C" simple_grpc_aio_sequence_stream_infer_client.py -u $G -d
run "grpc keepalive" "$C" simple_grpc_keepalive_client.py -u $G
run "grpc custom_args" "$C" simple_grpc_custom_args_client.py -u $G
run "grpc custom_repeat" "$C" simple_grpc_custom_repeat.py -u $G
run "grpc explicit_byte_content" "$C" grpc_explicit_byte_content_client.py -u $G
run "grpc explicit_int_content" "$C" grpc_explicit_int_content_client.py -u $G
run "grpc explicit_int8_content" "$C" grpc_explicit_int8_content_client.py -u $G
run "grpc grpc_image_client" "$C" grpc_image_client.py -u $G -m densenet_onnx -c 3 -s INCEPTION "$IMAGE"
run "pb add_sub" "$PB/add_sub" client.py
run "pb pytorch" "$PB/pytorch" client.py
run "pb bls sync" "$PB/bls" sync_client.py
run "pb bls async" "$PB/bls" async_client.py
run "pb bls_decoupled sync" "$PB/bls_decoupled" sync_client.py
run "pb bls_decoupled async" "$PB/bls_decoupled" async_client.py
run "pb decoupled repeat" "$PB/decoupled" repeat_client.py
run "pb decoupled square" "$PB/decoupled" square_client.py
run "pb auto_complete" "$PB/auto_complete" client.py
run "pb custom_metrics" "$PB/custom_metrics" client.py
echo "passed $pass, failed $fail"
