#!/usr/bin/env bash
# GPU checks of wip/pace ("The tuning loop at the GPU's pace"), for one GPU machine (sized for ~500 s on an H200).
# From the device tool: run(command="bash scripts/pace-gpu.sh", carry=[".whl", ".diag"], timeout_s=600): the wheels and .diag/base (the compared tree) are git-excluded,
# so it travels only when carried (the script, .diag/base: main's tree for --compare-tree, .diag/whl: wheels).
#
#   bash .diag/pace_gpu.sh                     # every stage: env build tests sweep fidelity tune
#   bash .diag/pace_gpu.sh tests sweep         # only those stages (env always runs first)
#
# Environment:
#   OUT          where logs and result files go (the device tool sets it; default /tmp/pace-out)
#   SKIP_BUILD   set: do not pip-install this tree (nor build the base tree: BASE_SITE must then be given)
#   BASE_TREE    a source checkout of main before the pace work (e.g. .diag/base made by
#                `mkdir -p .diag/base && git archive 26df491 | tar -x -C .diag/base`); built here into BASE_SITE
#                and given to sweep_pace.py --compare-tree. Unset: .diag/base when it is there, else
#                `git worktree add` of BASE_COMMIT when .git is
#                there, else the sweep runs without the comparison (said in the log).
#   BASE_COMMIT  default 26df491 (main at the last merge into wip/pace: everything but the pace work)
#   BASE_SITE    an importable, built base mneme (pip install --target); default /tmp/pace-base-site
#   WHEELS       a folder of wheels for missing Python packages (default .diag/whl, prepared: optuna and its needs,
#                minio, zstandard, blake3, shtab, grpcio-reflection for CPython 3.12), installed to /tmp/site
#   CONFIGS      configurations per sweep row (default 1000; the issue asks >= 1,000)
#   TRIALS       trials of the `mneme tune` stage (default 1000)
#   ROWS         sweep_pace rows (default launch,reference,small,compile,tune)
#   PY           the Python (default python3)
#   SWEEP_ARGS   more sweep_pace.py arguments (e.g. "--engine test" to try the stage without a GPU)
#
# $OUT receives at most 7 files: timings.txt env.log tests.log sweep.log sweep_pace.md fidelity.log tune.log.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
OUT="${OUT:-/tmp/pace-out}"
mkdir -p "$OUT"
PY="${PY:-python3}"
CONFIGS="${CONFIGS:-1000}"
TRIALS="${TRIALS:-1000}"
ROWS="${ROWS:-launch,reference,small,compile,tune}"
BASE_COMMIT="${BASE_COMMIT:-26df49186df417802091294e2a9b82434a81cb85}"
BASE_SITE="${BASE_SITE:-/tmp/pace-base-site}"
WHEELS="${WHEELS:-$REPO/.whl}"
WORK="$(mktemp -d /tmp/pace-work.XXXXXX)"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
T0=$(date +%s)
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(build tests sweep fidelity tune)

say() { echo "[pace_gpu $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/timings.txt"; }
want() { local s; for s in "${STAGES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
# run_stage NAME LOG LIMIT_S CMD...: the command's output to LOG, bounded by LIMIT_S, its time and status noted
run_stage() {
  local name=$1 log=$2 limit=$3; shift 3
  local t=$(date +%s)
  say "$name: start (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  say "$name: rc=$rc in $(( $(date +%s) - t ))s (log: $(basename "$log"))"
  return $rc
}

# -- env: the machine, the Python, what mneme needs at run time ---------------------------------------------
{
  echo "repo: $REPO  stages: ${STAGES[*]}  configs: $CONFIGS  trials: $TRIALS  rows: $ROWS"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  echo "cpus: $(nproc)"; $PY --version; command -v nvcc && nvcc --version | tail -2
} >"$OUT/env.log" 2>&1
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  say "env: installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into /tmp/site"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    >>"$OUT/env.log" 2>&1 || say "env: the wheels did not install (see env.log)"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
MISSING=$($PY - <<'EOF' 2>>"$OUT/env.log"
import importlib.util
mods = {"grpcio": "grpc", "grpcio-reflection": "grpc_reflection", "protobuf": "google.protobuf", "minio": "minio",
        "optuna": "optuna", "prometheus-client": "prometheus_client", "zstandard": "zstandard", "xxhash": "xxhash",
        "blake3": "blake3", "rich": "rich", "pyyaml": "yaml", "shtab": "shtab", "nvidia-ml-py": "pynvml",
        "pytest": "pytest", "pytest-timeout": "pytest_timeout", "scikit-build-core": "scikit_build_core",
        "pybind11": "pybind11"}
print(" ".join(name for name, mod in mods.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$MISSING" ]; then
  say "env: MISSING Python packages: $MISSING (carry them as wheels in $WHEELS: /work/.library/device/README.md)"
else
  say "env: every Python package mneme needs is importable"
fi

# -- build: this tree installed; the base tree built beside it (in parallel) ---------------------------------
BASE_OK=""
prepare_base_tree() {
  [ -z "${BASE_TREE:-}" ] && [ -f "$REPO/.diag/base/pyproject.toml" ] && BASE_TREE="$REPO/.diag/base"
  if [ -n "${BASE_TREE:-}" ]; then
    [ -d "$BASE_TREE" ] || { echo "BASE_TREE=$BASE_TREE is not a folder"; return 1; }
    echo "$BASE_TREE"; return 0
  fi
  if git -C "$REPO" rev-parse --verify -q "$BASE_COMMIT^{commit}" >/dev/null 2>&1; then
    rm -rf /tmp/pace-base-tree
    git -C "$REPO" worktree add --detach /tmp/pace-base-tree "$BASE_COMMIT" >&2 && { echo /tmp/pace-base-tree; return 0; }
  fi
  return 1
}
if [ -n "${SKIP_BUILD:-}" ]; then
  say "build: skipped (SKIP_BUILD)"
  [ -d "$BASE_SITE/mneme" ] && BASE_OK=1
elif want build; then
  BASE_SRC=$(prepare_base_tree 2>>"$OUT/env.log")
  if [ -n "$BASE_SRC" ]; then
    rm -rf "$BASE_SITE"
    ( run_stage "build base ($BASE_SRC)" "$OUT/env.log" 400 \
        $PY -m pip install -q --no-build-isolation --no-deps --target "$BASE_SITE" "$BASE_SRC" ) &
    BASE_PID=$!
  else
    say "build: no base tree (no BASE_TREE, and no .git with $BASE_COMMIT here): the sweep runs WITHOUT --compare-tree"
  fi
  run_stage "build this tree" "$OUT/env.log" 400 $PY -m pip install -q --no-build-isolation --no-deps . \
    || { say "build: this tree did not install: stopping"; exit 1; }
  if [ -n "${BASE_PID:-}" ]; then
    wait "$BASE_PID" && [ -d "$BASE_SITE/mneme" ] && BASE_OK=1
  fi
else
  [ -d "$BASE_SITE/mneme" ] && BASE_OK=1
fi
# -P: the source tree (no native parts in it) must not shadow the installed mneme.
(cd /tmp && $PY -P -c "import mneme._engine as e, mneme; print('mneme', mneme.__file__, 'driver available:', e.driver_available(), e.driver_unavailable_reason())") \
  >>"$OUT/env.log" 2>&1 || say "env: the installed mneme does not import its engine (see env.log)"

# -- tests: the GPU contract tests of batched replays, the servers, non-idempotent kernels --------------------
if want tests; then
  run_stage "tests" "$OUT/tests.log" 240 $PY -P -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    tests/gpu/test_replay.py tests/gpu/test_non_idempotent.py tests/gpu/test_server.py tests/gpu/test_textures.py \
    -k "batch or enqueued or server or executor or compiled_ahead or idempot or reset or texture or surface"
  tail -3 "$OUT/tests.log" | sed 's/^/  /' | tee -a "$OUT/timings.txt"
fi

# -- sweep: bench/sweep_pace.py, the issue's rows, against the base tree ------------------------------------
if want sweep; then
  COMPARE=()
  if [ -n "$BASE_OK" ]; then
    COMPARE=(--compare-tree "$BASE_SITE" --compare-label "main@${BASE_COMMIT:0:7}")
  else
    say "sweep: no built base tree in $BASE_SITE: this tree alone"
  fi
  run_stage "sweep (rows $ROWS, >= $CONFIGS configurations each)" "$OUT/sweep.log" 330 \
    $PY -P bench/sweep_pace.py --rows "$ROWS" --configs "$CONFIGS" --results-file "$OUT/sweep_pace.md" "${COMPARE[@]}" ${SWEEP_ARGS:-}
  grep -A40 "^| row" "$OUT/sweep.log" | tee -a "$OUT/timings.txt" >/dev/null
fi

# -- fidelity: the replayed baseline against the in-app kernel, alone and beside a second worker --------------
if want fidelity; then
  run_stage "fidelity (default mode; --neighbours 1: as with 2 workers)" "$OUT/fidelity.log" 150 \
    $PY bench/replay_fidelity.py --modes default --neighbours 1 --launches 200  # (not -P: it imports bench/results_file.py)
fi

# -- tune: mneme tune of >= 1,000 configurations, full preset, random, on the README's vector-add recording ----
if want tune; then
  {
    make -C examples/vecadd NVCC="$(command -v nvcc)" \
    && (cd "$WORK" && $PY -P -m mneme record -rdb "$WORK/recordings/vecadd" -- "$REPO/examples/vecadd/vecadd")
  } >>"$OUT/tune.log" 2>&1
  DB=$(ls "$WORK"/recordings/vecadd/*.json 2>/dev/null | head -1)
  if [ -z "$DB" ]; then
    say "tune: the vector add was not recorded (see tune.log)"
  else
    run_stage "tune ($TRIALS trials, full preset, random)" "$OUT/tune.log" 200 \
      bash -c "cd '$WORK' && $PY -P -m mneme tune -rdb '$DB' --space-preset full --sampler random --trials $TRIALS \
        --seed 1 --results-dir '$WORK/tune-vecadd'"
    for f in summary.json best.json; do
      [ -f "$WORK/tune-vecadd/$f" ] && { echo "== $f"; cat "$WORK/tune-vecadd/$f"; } >>"$OUT/tune.log"
    done
    [ -f "$WORK/tune-vecadd/trials.jsonl" ] && $PY - "$WORK/tune-vecadd/trials.jsonl" <<'EOF' | tee -a "$OUT/timings.txt" >>"$OUT/tune.log"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(f"  tune: {len(rows)} trials in trials.jsonl; statuses:",
      {s: sum(1 for r in rows if r.get('status') == s) for s in {r.get('status') for r in rows}})
EOF
  fi
fi

say "done in $(( $(date +%s) - T0 ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
