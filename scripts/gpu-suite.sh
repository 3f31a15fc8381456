#!/usr/bin/env bash
# One call on the GPU machine: install carried wheels, build and install mneme,
# run the GPU tests and (optionally) the benchmarks, logs under $OUT.
#
#   scripts/gpu-suite.sh tests [PYTEST ARGS...]   # GPU tests only (default)
#   scripts/gpu-suite.sh bench [BENCH NAMES...]   # benchmarks only (BENCH_TIMEOUT seconds each, default 300)
#   scripts/gpu-suite.sh all                      # both
# SKIP_BUILD=1 reuses the installed build; HEADLINE_ARGS adds options to bench/headline.py,
# BENCH_ARGS to the other benchmarks (name one bench when using it);
# MNEME_COMMIT names the commit in its table (the copied .git can lag behind the files).
#
# Needs the wheels of packages the GPU machine lacks in .whl/ (carried with the
# working tree; see docs/development.md).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/mneme-gpu-suite}"
mkdir -p "$OUT"
mode="${1:-tests}"; shift || true
export PYTHONUNBUFFERED=1

if ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$REPO"/.whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
{ nvidia-smi -L; nvcc --version | tail -1; python3 --version; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ -z "${SKIP_BUILD:-}" ]; then
  echo "== build and install mneme"
  # A warm machine keeps ignored build outputs between calls, and the copied sources
  # can look older than them: build from scratch so no stale object is installed.
  rm -rf "$REPO"/build/cp3*
  if ! python3 -m pip install --no-build-isolation --no-deps "$REPO" > "$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log"; exit 1
  fi
  tail -1 "$OUT/build.log"
fi

status=0
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  echo "== GPU tests"
  # Run from outside the checkout so the installed package (with its native parts) is imported.
  (cd /tmp && python3 -m pytest "$REPO/tests" -c "$REPO/pyproject.toml" --rootdir "$REPO" \
     -m gpu -p no:cacheprovider "$@") 2>&1 | tee "$OUT/gpu-tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  names=("$@"); [ "$mode" = all ] && names=()
  [ ${#names[@]} -eq 0 ] && names=(replay_fidelity server_throughput ptx_compile_latency record_overhead record_overhead_parts llvm_compile headline)
  mkdir -p "$OUT/bench/results"
  # The benchmarks' result files (bench/results/NAME.md) are updated in a copy that comes back in bench.tgz.
  cp "$REPO"/bench/results/*.md "$OUT/bench/results/" 2>/dev/null || true
  export MNEME_BENCH_RESULTS="${MNEME_BENCH_RESULTS:-$OUT/bench/results}"
  for name in "${names[@]}"; do
    echo "== bench $name"
    args=(${BENCH_ARGS:-}); [ "$name" = headline ] && args=(--out "$OUT/bench/headline" ${HEADLINE_ARGS:-})
    (cd /tmp && timeout "${BENCH_TIMEOUT:-300}" python3 "$REPO/bench/$name.py" "${args[@]}") 2>&1 | tee "$OUT/bench/$name.log"
  done
  # $OUT returns few files: pack the benchmark outputs into one.
  # (Not the examples' builds and recordings: they would pass the size a returned file may have.)
  tar czf "$OUT/bench.tgz" -C "$OUT" --exclude=build --exclude=recordings --exclude='*.mneme' bench && rm -rf "$OUT/bench"
fi
exit "$status"
