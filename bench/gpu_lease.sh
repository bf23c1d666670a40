#!/usr/bin/env bash
# The GPU measurements and checks of issue 27 as one command on a lent GPU machine
# (../shared/gpu/README.md: the TensorFlow wheel's chunks already moved to /tmp/t; this
# call carries .gpu/small, .gpu/setup.sh, the tf_dtensor wheel and, for TensorFlow's own
# DTensor tests and the Keras tests, .gpu/tfsuite and .gpu/keras). Writes at most 8 files
# under $OUT (or ./gpu_out), what a lease brings back: bench.log, bench_jit.log, prof_summary.txt, profiles.tgz, suite.log,
# gpu_tests.log, gpu_rules.log and details.tgz (suite.json, focus.log). Each part has its
# own time limit, so a slow or hung part still leaves the others' results. A lease has
# 15 minutes of device time in all, starts included, and one command at most 10 minutes:
# PARTS (default "bench,jit,suite,tests") picks the parts of this call, so that two calls
# back to back can share them: PARTS=bench,jit (about 6.5 minutes), then
# PARTS=suite,tests (about 4.5).
#   BENCH_S, JIT_S, SUITE_S, TESTS_S, RULES_S: seconds for the bench (with BENCH_ARGS and
#   profiles), a second bench run with the XLA auto-clustering columns (--jit) of the
#   tf.function rows in its own process, so that an XLA failure cannot cost the main table,
#   TensorFlow's own DTensor tests that run on GPUs on both libraries (tools/tf_suite.py;
#   TensorFlow's files, never in this repository: bring them into .gpu/tfsuite), the `gpu`
#   dtype and training tests, and the numerical checks + fuzzer on GPU meshes (0: skip;
#   the rules part is off by default: it passed on the H200 on 2026-11-26, 419 checks, and
#   had not reached the fuzzer in 150 s). FOCUS (a pytest -k expression) and FOCUS_S run
#   chosen checks first, keeping their failure messages. BENCH_ARGS (default none: the
#   issue's table) adds bench options: "--variants" the variant columns and probe rows,
#   "--only MLP" the step alone. With --variants the relayout rows in a tf.function take
#   minutes: on 2026-11-30's H200 lease the table with variants outran 260 s and came back
#   empty; the table now prints after every round, and variants are asked for.
# The calls of a lease, back to back (an idle machine goes back after about 30 s): here
# `bash ../shared/gpu/prepare.sh --wheel` first (.gpu/wheel_commit says which commit the
# wheel holds); then ten `run`s of `mkdir -p /tmp/t && mv .gpu/tfwhl.* /tmp/t/`, carrying
# .gpu/tfwhl.00, .01, ... .09; then `PARTS=bench,jit bash bench/gpu_lease.sh` (timeout_s
# 560) and `PARTS=suite,tests bash bench/gpu_lease.sh` (timeout_s 330), each carrying
# .gpu/small, .gpu/setup.sh, .gpu/tf_dtensor-0.1.0-cp312-cp312-linux_x86_64.whl,
# .gpu/tfsuite and .gpu/keras; then `give_back`.
set -u
out=${OUT:-gpu_out}
PARTS=",${PARTS:-bench,jit,suite,tests},"
part() { [[ "$PARTS" == *",$1,"* ]]; }
mkdir -p "$out"
export TF_DTENSOR_GPU_REINSTALL=${TF_DTENSOR_GPU_REINSTALL:-1}
source .gpu/setup.sh
# Keras 3 and the wheels it needs that the image lacks (for the Keras `gpu` tests), carried
# in .gpu/keras: `pip download --no-deps` of keras==3.15.1, namex, optree, rich,
# markdown-it-py, mdurl, pygments and h5py for CPython 3.12.
if [ -d .gpu/keras ] && ! python3 -c "import keras" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/keras/*.whl
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tail -2
python3 -c "import tensorflow as tf, tf_dtensor; print('TF', tf.__version__, tf.config.list_physical_devices('GPU'))" 2>&1 | tail -1

if part bench; then
  timeout "${BENCH_S:-260}" python3 bench/run.py --device gpu --rounds "${ROUNDS:-5}" \
    ${BENCH_ARGS:-} --profile /tmp/prof 2>&1 | grep -v "^W0000\|^I0000" | tee "$out/bench.log"
  (cd /tmp/prof 2>/dev/null && tar czf "$out/profiles.tgz" . 2>/dev/null)
  python3 tools/xspace_summary.py /tmp/prof --steps 5 > "$out/prof_summary.txt" 2>&1
fi
if part jit && [ "${JIT_S:-120}" != 0 ]; then
  timeout "${JIT_S:-120}" python3 bench/run.py --device gpu --rounds "${ROUNDS:-5}" --jit \
    --only "MLP,matmul" 2>&1 | grep -v "^W0000\|^I0000" | tee "$out/bench_jit.log" | tail -12
fi

# TensorFlow's own DTensor test files that run on GPUs, on both libraries (the files are
# TensorFlow's and not in this repository: carry them in .gpu/tfsuite, see tools/tf_suite.py;
# a fresh checkout makes it from tensorflow/tensorflow's tensorflow/dtensor/python/tests/
# <file>.py for the files below, and tensorflow/dtensor/python/d_random.py in _support/).
SUITE_S=${SUITE_S:-150}
if part suite && [ -d .gpu/tfsuite ] && [ "$SUITE_S" != 0 ]; then
  timeout "${SUITE_S}" python3 tools/tf_suite.py --tests .gpu/tfsuite --jobs "${SUITE_JOBS:-8}" \
    --timeout "$((SUITE_S - 10))" --out "$out/suite.json" \
    --files collective_test,layout_propagation_test,mnist_test,multi_mesh_test,numpy_util_test,save_restore_v2_test,variable_test \
    2>&1 | tee "$out/suite.log" | tail -12
fi

if part tests; then
  timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -m gpu -rf \
    tests/python/test_gpu.py -k "not numerical" 2>&1 | tail -40 > "$out/gpu_tests.log"
  tail -8 "$out/gpu_tests.log"
fi

# The checks that failed on the last GPU run, with their messages (a run cut short by its
# time limit prints none): FOCUS is a pytest -k expression, FOCUS_S its time.
if [ -n "${FOCUS:-}" ]; then
  TF_DTENSOR_TEST_DEVICE=GPU timeout "${FOCUS_S:-90}" python3 -m pytest -q -p no:cacheprovider \
    -m "not gpu" --tb=short -k "$FOCUS" tests/python/test_rules_*.py tests/python/fuzz/test_fuzz.py \
    2>&1 | grep -E "^E   |^____|passed|failed" | head -300 > "$out/focus.log"
  tail -1 "$out/focus.log"
fi

# -v: one line per test, so that a run cut short by its time limit still names failures.
if [ "${RULES_S:-0}" != 0 ]; then
  TF_DTENSOR_TEST_DEVICE=GPU timeout "${RULES_S}" python3 -m pytest -v -p no:cacheprovider \
    -m "not gpu" -rf tests/python/test_rules_*.py tests/python/fuzz/test_fuzz.py 2>&1 \
    | grep -v "^W0000\|^I0000" > "$out/gpu_rules.log"
  echo "rules: $(grep -c " PASSED" "$out/gpu_rules.log") passed, $(grep -c " FAILED" "$out/gpu_rules.log") failed"
  grep " FAILED" "$out/gpu_rules.log" | sed 's/ FAILED.*//' | awk -F'::' '{print $1"::"$2}' | sed 's/\[.*//' | sort | uniq -c | head -20
fi

# At most 8 files come back: the details go as one archive.
(cd "$out" && tar czf details.tgz $(ls suite.json focus.log 2>/dev/null) 2>/dev/null && rm -f suite.json focus.log)
ls "$out"
