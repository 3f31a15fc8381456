#!/bin/bash
# What the recorder's GPU session runs on the device machine (kept for re-runs):
# build the recorder, run the GPU recording tests, the overhead benchmark, and
# (with MAKE_RECORDING=1) the committed vecadd recording.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/recsrc && printf "cmake_minimum_required(VERSION 3.18)\nproject(r CXX)\nadd_subdirectory($PWD/native/common common)\nadd_subdirectory($PWD/native/recorder recorder)\n" > /tmp/recsrc/CMakeLists.txt
cmake -S /tmp/recsrc -B /tmp/recbuild -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build /tmp/recbuild >/dev/null || exit 1
export MNEME_RECORDER_LIB=/tmp/recbuild/recorder/libmneme_recorder.so
if [ "$REPLAY" = 1 ]; then  # the replay engine too, for tests/gpu/test_record_replay.py
  cmake -S native/engine -B /tmp/enginebuild -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR=$(python3 -m pybind11 --cmakedir) >/dev/null \
    && cmake --build /tmp/enginebuild >/dev/null && cp /tmp/enginebuild/_engine*.so mneme/ || exit 1
  TESTS="tests/gpu/test_record.py tests/gpu/test_record_replay.py"
fi
python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/gpu/test_record.py} "$@" 2>&1 | tee $OUT/pytest.log | tail -30
[ "$BENCH" = 1 ] && python3 bench/record_overhead.py --json $OUT/record_overhead.json 2>&1 | tee $OUT/bench.log
if [ "$MAKE_RECORDING" = 1 ]; then
  make -s -C examples/vecadd vecadd
  rm -rf /tmp/vecadd_rec && python3 -m mneme record -rdb /tmp/vecadd_rec -- examples/vecadd/vecadd 16384 2 && tar -C /tmp -czf $OUT/vecadd_recording.tgz vecadd_rec
fi
