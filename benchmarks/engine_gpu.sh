#!/usr/bin/env bash
# The engine suite on a GPU: tests/engine with CUDA visible (CUDA is the engine's default device
# there, and the CUDA tests run), a one-screen summary, the full log at the path given.
#
#   PYTHONPATH=src bash benchmarks/engine_gpu.sh LOG [WHEEL_DIR]
#
# Needs torch (with CUDA), transformers, safetensors, numpy, xxhash, pytest and hypothesis.
# WHEEL_DIR: wheels for whatever of pytest / hypothesis is missing, for a machine without a
# package index; they are installed into a temporary folder put on PYTHONPATH, nothing else
# changes. Make it beside the repository with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --implementation cp pytest hypothesis -d .venv-gpu-wheels
# Exit status: pytest's (0 when every test passed).
set -uo pipefail
LOG=${1:?usage: PYTHONPATH=src bash benchmarks/engine_gpu.sh LOG [WHEEL_DIR]}
WHEELS=${2:-}
cd "$(dirname "$0")/.."
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
    if [ -z "$WHEELS" ]; then
        echo "pytest or hypothesis is missing: pass a WHEEL_DIR (see the header)" | tee -a "$LOG"
        exit 2
    fi
    SITE=$(mktemp -d)/site
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$SITE" pytest hypothesis >>"$LOG" 2>&1 \
        || { echo "installing pytest / hypothesis from $WHEELS failed (see $LOG)"; exit 2; }
    export PYTHONPATH="$PYTHONPATH:$SITE"
fi

"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import platform, sys
import torch, transformers
from hybridkv.engine.versions import in_tested_range, range_text
cuda = torch.cuda.is_available()
print(f"python {platform.python_version()}  torch {torch.__version__}  transformers {transformers.__version__} "
      f"({'in' if in_tested_range(transformers.__version__) else 'OUTSIDE'} the tested range {range_text()})")
print(f"device: {torch.cuda.get_device_name(0) if cuda else 'no CUDA device: the CUDA tests will skip'}")
EOF

start=$(date +%s)
"$PY" -m pytest -q -p no:cacheprovider -rfEs --tb=short tests/engine >>"$LOG" 2>&1
rc=$?
wall=$(( $(date +%s) - start ))

{
    echo "--- tests/engine: $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$LOG" | tail -1 | tr -d '=' | sed -E 's/ in [0-9.]+s.*//') in ${wall}s (exit $rc)"
    if grep -q "SKIPPED.*needs CUDA" "$LOG"; then echo "CUDA tests: skipped (no CUDA device)"; fi
    fails=$(grep -E '^(FAILED|ERROR) ' "$LOG" | sed -E 's/ - .*//')
    if [ -n "$fails" ]; then
        echo "failures by model (the [...] parameter):"
        echo "$fails" | grep -oE '\[[^]]*\]' | sort | uniq -c | sort -rn | head -12
        echo "failed tests:"
        echo "$fails" | head -40
    fi
    echo "full log: $LOG"
} | tee -a "$LOG"
exit $rc
