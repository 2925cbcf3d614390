#!/usr/bin/env bash
# Create one virtualenv per peer server (MLServer, KServe) with pinned versions,
# so the peers never share packages with Naiad's own venv.
#
#   bash benchmarks/setup_peers.sh [VENV_ROOT]     (default: $NAIAD_BENCH_VENVS, else .venv-bench in the checkout)
#
# Re-running it is cheap: an existing venv whose pinned server already imports is left alone.
set -euo pipefail

ROOT="${1:-${NAIAD_BENCH_VENVS:-$(cd "$(dirname "$0")/.." && pwd)/.venv-bench}}"
PYTHON="${PYTHON:-python3}"

MLSERVER_VERSION="1.7.1"
KSERVE_VERSION="0.21.0"
ONNXRUNTIME_VERSION="1.31.1"
XGBOOST_VERSION="3.2.0"  # the XGBoost tree model of matrix_bench.py (peers/ serve it with xgboost)

make_venv() {
    local name="$1" check="$2"; shift 2
    local venv="$ROOT/$name"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
        echo "[$name] already installed in $venv"
        return 0
    fi
    echo "[$name] creating $venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet "$@"
    "$venv/bin/python" -c "$check"
    echo "[$name] ok"
}

mkdir -p "$ROOT"
make_venv mlserver \
    "import mlserver, onnxruntime, xgboost; assert mlserver.__version__ == '$MLSERVER_VERSION', mlserver.__version__" \
    "mlserver==$MLSERVER_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "xgboost-cpu==$XGBOOST_VERSION"
make_venv kserve \
    "import kserve, onnxruntime, xgboost, importlib.metadata as m; assert m.version('kserve') == '$KSERVE_VERSION'" \
    "kserve==$KSERVE_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "xgboost-cpu==$XGBOOST_VERSION"
echo "peer venvs ready under $ROOT"
