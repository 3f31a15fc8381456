#!/bin/bash
# Threads under `mneme record`, in one GPU session: builds the package and the
# thread programs, runs each variant plain and under `mneme record` (with a
# time limit; MNEME_VERBOSE=1), and for a run still going after STUCK_S seconds
# writes every thread's backtrace (gdb, else eu-stack) and /proc state before
# killing it. Writes everything under $OUT: <variant>.plain.log,
# <variant>.record.log, <variant>.bt, summary.txt. With --tests it then runs
# tests/gpu/test_threads.py (log and junit XML under $OUT).
#
# From the repository root:  bash tests/gpu/programs/threads/diagnose.sh [--tests]
# Set RECORDER_LIB=/path/libmneme_recorder.so to record with another recorder
# build (say, main's) against this checkout's agent, for a before/after.
set -u
OUT=${OUT:-/tmp/threads-diagnose}
mkdir -p "$OUT"
ROOT=$(pwd)
STUCK_S=${STUCK_S:-20}
LIMIT_S=${LIMIT_S:-45}
exec > >(tee -a "$OUT/diagnose.log") 2>&1

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L
which gdb eu-stack
python3 - <<'PY' > "$OUT/devattrs.txt" 2>&1
import ctypes
cuda = ctypes.CDLL("libcuda.so.1"); cuda.cuInit(0)
for name, attr in [("concurrentManagedAccess", 89), ("pageableMemoryAccess", 88),
                   ("pageableMemoryAccessUsesHostPageTables", 100), ("directManagedMemAccessFromHost", 101)]:
    v = ctypes.c_int(); cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, 0); print(name, v.value)
PY
cat "$OUT/devattrs.txt"
rm -rf build/cp3*
python3 -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import mneme, pathlib; print('mneme from', pathlib.Path(mneme.__file__).parent)"

# Programs: with cuBLAS where its header and library are found (CUDA toolkit, or the nvidia-cublas wheel).
BIN=/tmp/threads-bin
mkdir -p $BIN
SRC=$ROOT/tests/gpu/programs/threads
CUDA=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
CUBLAS=()
for inc in "$CUDA/include" /usr/local/cuda/include; do
  if [ -f "$inc/cublas_v2.h" ] && ls "$(dirname "$inc")"/lib64/libcublas.so* >/dev/null 2>&1; then
    lib=$(dirname "$inc")/lib64; CUBLAS=(-I"$inc" -L"$lib" -lcublas -Xlinker -rpath="$lib"); break
  fi
done
if [ ${#CUBLAS[@]} -eq 0 ]; then
  PKG=$(python3 -c 'import nvidia.cublas as c; print(list(c.__path__)[0])' 2>/dev/null)
  if [ -n "$PKG" ] && [ -f "$PKG/include/cublas_v2.h" ]; then
    so=$(basename "$(ls "$PKG"/lib/libcublas.so* | tail -1)")
    CUBLAS=(-I"$PKG/include" -L"$PKG/lib" -l:"$so" -Xlinker -rpath="$PKG/lib")
  fi
fi
echo "cuBLAS flags: ${CUBLAS[*]:-none (cuBLAS variants skipped)}"
build() {  # name source flags...
  local name=$1 src=$2; shift 2
  nvcc -O2 -arch=sm_90 "$@" -o "$BIN/$name" "$SRC/$src" > "$OUT/build_$name.log" 2>&1 || { echo "build $name failed"; tail -5 "$OUT/build_$name.log"; }
}
build threads_managed threads_managed.cu
build threads_omp threads_omp.cu -Xcompiler -fopenmp
build threads_streams threads_streams.cu
build slow_kernels slow_kernels.cu
if [ ${#CUBLAS[@]} -gt 0 ]; then
  build threads_managed_cublas threads_managed.cu -DWITH_CUBLAS "${CUBLAS[@]}"
  build threads_omp_cublas threads_omp.cu -Xcompiler -fopenmp -DWITH_CUBLAS "${CUBLAS[@]}"
fi
ls -la $BIN

RECORD_ENV=(MNEME_VERBOSE=1)
[ -n "${RECORDER_LIB:-}" ] && RECORD_ENV+=(MNEME_RECORDER_LIB="$RECORDER_LIB")

backtraces() {  # pid file
  local pid=$1 file=$2
  {
    echo "== pid $pid: $(tr '\0' ' ' < /proc/$pid/cmdline)"
    for t in /proc/$pid/task/*; do
      echo "$t $(cat $t/comm) state=$(cut -d' ' -f3 $t/stat) wchan=$(cat $t/wchan 2>/dev/null)"
    done
  } >> "$file"
  if command -v gdb >/dev/null; then
    timeout 60 gdb -p "$pid" -batch -ex "set pagination off" -ex "thread apply all bt 30" >> "$file" 2>&1
  elif command -v eu-stack >/dev/null; then
    timeout 60 eu-stack -p "$pid" >> "$file" 2>&1
  fi
}

run_case() {  # variant program args...
  local name=$1 prog=$2; shift 2
  if [ ! -x "$BIN/$prog" ]; then echo "$name: SKIPPED ($prog not built)" | tee -a "$OUT/summary.txt"; return; fi
  local t0=$(date +%s.%N)
  timeout -s KILL $LIMIT_S "$BIN/$prog" "$@" > "$OUT/$name.plain.log" 2>&1
  local plain_rc=$? t1=$(date +%s.%N)
  local rdb=/tmp/threads-rdb/$name; rm -rf "$rdb"
  ( env "${RECORD_ENV[@]}" setsid timeout -s KILL $LIMIT_S python3 -m mneme record -rdb "$rdb" -- "$BIN/$prog" "$@" \
      > "$OUT/$name.record.log" 2>&1; echo "exit $?" >> "$OUT/$name.record.log" ) &
  local runner=$! waited=0 app=""
  while kill -0 $runner 2>/dev/null && [ $waited -lt $STUCK_S ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 $runner 2>/dev/null; then
    app=$(pgrep -n -f "$BIN/$prog( |\$)")
    echo "== $name still running after $STUCK_S s: app pid ${app:-?}" >> "$OUT/$name.record.log"
    [ -n "$app" ] && backtraces "$app" "$OUT/$name.bt"
  fi
  wait $runner
  local t2=$(date +%s.%N)
  app=$(pgrep -n -f "$BIN/$prog( |\$)")  # an application the agent's kill left behind
  [ -n "$app" ] && kill -9 "$app"
  local rec_rc=$(tail -1 "$OUT/$name.record.log" | sed 's/exit //')
  local same=same
  diff <(grep -v '^mneme record' "$OUT/$name.record.log" | grep -v '^exit ') "$OUT/$name.plain.log" > /dev/null || same=DIFFERENT
  printf '%-28s plain rc=%s %ss | record rc=%s %ss | app output %s | %s | abandoned: %s\n' "$name" "$plain_rc" \
    "$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")" "$rec_rc" "$(awk "BEGIN{printf \"%.2f\", $t2 - $t1}")" "$same" \
    "$(grep -m1 -o 'recorded [0-9]* instance(s) of [0-9]* kernel(s)' "$OUT/$name.record.log" || echo 'nothing recorded')" \
    "$(grep -c 'abandoned:' "$OUT/$name.record.log")" | tee -a "$OUT/summary.txt"
  grep -m3 'mneme record: error' "$OUT/$name.record.log" | tee -a "$OUT/summary.txt"
  python3 -m mneme ls "$rdb" > "$OUT/$name.ls.txt" 2>&1
}

: > "$OUT/summary.txt"
cd /tmp
run_case tm                 threads_managed 4 2 8
run_case tm_nohost          threads_managed 4 0 8
run_case tmb                threads_managed_cublas 4 2 8
run_case tmb1               threads_managed_cublas 1 0 2
run_case tmb8               threads_managed_cublas 8 4 16
run_case omp                threads_omp 4 4 50
run_case ompb               threads_omp_cublas 4 4 50
run_case ompb_large         threads_omp_cublas 4 4 20 262144 256
run_case streams8           threads_streams 8 4
run_case streams8_managed   threads_streams 8 4 managed
run_case slow_record_quick  slow_kernels 3000
echo; echo "== summary"; cat "$OUT/summary.txt"

if [ "${1:-}" = "--tests" ]; then
  cd "$ROOT"
  timeout 1500 python3 -m pytest -q -m gpu tests/gpu/test_threads.py -p no:cacheprovider -rs -s \
    --junitxml="$OUT/test_threads.xml" > "$OUT/test_threads.log" 2>&1
  echo "pytest exit $?"; tail -30 "$OUT/test_threads.log"
fi
