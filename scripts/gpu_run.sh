#!/usr/bin/env bash
# One command for a GPU machine: build, GPU tests, graph check, benchmarks
# and the tensor-parallel decode. Writes logs and results under $OUT (default
# ./out) and prints a short table last.
#
#   scripts/gpu_run.sh [stage ...]     stages: build tests graph kbench sol bench
#                                      flags demo (default: all but flags, in
#                                      that order)
#
# Stages and their commands:
#   build   pip install --no-build-isolation --no-deps -e .
#   tests   JAX_LLAR_TEST_GPU=1 pytest tests/gpu
#   graph   python -m jax_llar.tools.graphcheck --timeline_copy
#   kbench  python -m jax_llar.tools.bench --level kernel
#   sol     python -m jax_llar.tools.sol --kernel_json <the kbench result>
#   bench   python -m jax_llar.tools.bench --level jax
#   flags   python -m jax_llar.tools.bench --level jax --psum_flags (lax.psum
#           under XLA flags that target small all-reduces, one process each)
#   demo    python examples/tp_decode/main.py --json $OUT/demo.json (Llama-3.2-1B and
#           Llama-3-8B at batch 1 against lax.psum under each XLA flag, the
#           identity and the weight-read floor)
#   sweep   the same over batch 1-64, without the flag baselines
#   loop    python -m jax_llar.tools.bench --level loop (psum + multiply in each
#           loop structure a user would write)
#   loopflags  the loop level under each XLA flag set that changes how loops run,
#           one process each
#   cg      python examples/cg_solver/main.py (conjugate gradient, time per
#           iteration against grid size)
#   gpu1    JAX_LLAR_TEST_GPU=1 pytest tests/gpu1 (the one-GPU suite: the
#           loopback harness's tests of every algorithm; GPU1_ARGS, and
#           GPU1_TESTS in place of tests/gpu1 to run some of them), with
#           --durations=0, in one process (GPU1_WORKERS=N: N pytest-xdist
#           workers, which the GPU time-slices: on one H200 8 workers made
#           the suite slower, benchmarks/NOTES.md)
#   sanitize  python -m jax_llar.tools.sanitize: compute-sanitizer's memcheck,
#           racecheck, synccheck and initcheck over every production kernel
#           through the loopback harness (the matrix in its docstring);
#           writes $OUT/<machine>-<date>-sanitize-<commit>.json; fails on any
#           sanitizer error; SANITIZE_ARGS
#   soak    python -m jax_llar.tools.soak (SOAK_ARGS, default --calls=2200000):
#           consecutive checked calls, mixed sizes, dtypes and algorithms; real
#           GPUs through XLA with 2+ GPUs, else the loopback on one
#   ensure  build only when the extension does not load (a warm machine
#           keeps the install of an earlier call)
#   cu12    the one-GPU suite (GPU1_TESTS, default tests/gpu1) with the CUDA 12
#           build of scripts/build_cuda12.sh instead of this machine's: its
#           libraries from $CU12_DIR (libllar_core.so, _llar*.so,
#           _llar_tools*.so, _build_info.py) copied into this tree's package,
#           which must not be installed (no build or ensure stage before it);
#           Python imports jax_llar from the tree
#   atomicity  python -m jax_llar.tools.store_atomicity across two GPUs, both
#           directions (writer 0 -> reader 1, 1 -> 0; --max_seconds
#           ATOMICITY_SECONDS, default 60), then the --split check that the
#           detector fails on purpose; records in $OUT and in $KEEP
#   tune    python -m jax_llar.tools.tune --verify: measure every algorithm,
#           write the tables to $OUT/tuning (JAX_LLAR_TUNING_DIR), then the
#           verification run; TUNE_ARGS; the store-atomicity records of
#           $KEEP (both directions passed) let the tables choose LL128
#   verify  python -m jax_llar.tools.tune --verify_from $KEEP/tune.json (the
#           tables of $KEEP/tuning): the verification run alone
#   loopback  python -m jax_llar.tools.loopback: world sizes 2-16 simulated on
#           ONE GPU (the protocol logic and the reduction, not NVLink, no
#           timings): the matrix with and without synchronising the ranks
#           between calls, from epoch 0 and from 2^32 - 26 (across the
#           re-zeroing window, the LL flags' 16-bit and the LL128 flags' 32-bit
#           epoch wraps), the generic kernel for 2, 4 and 8 ranks, a rank left
#           out of one call (the others must end in the bounded-wait error) and
#           a rank paired off by one extra call of another signature (the
#           foreign-signature error); child processes. Writes $OUT/loopback*.json.
# Environment: BENCH_ARGS, FLAGS_ARGS, KBENCH_ARGS, SOL_ARGS, GRAPH_ARGS,
# DEMO_ARGS, SWEEP_ARGS, LOOP_ARGS, LOOPFLAGS_ARGS, CG_ARGS, GPU1_ARGS, SOAK_ARGS, LOOPBACK_ARGS,
# TUNE_ARGS, ATOMICITY_SECONDS, KEEP (a folder that outlives $OUT on a warm
# machine, default /tmp/llar_keep: what later calls reuse)
# (extra flags of those commands; LOOPBACK_ARGS go to the three matrix runs of
# the loopback stage, LOOPBACK_FAULT_ARGS to its fault run), LLAR_GIT_COMMIT
# (the commit to record in result files when this copy of the tree is not a
# git checkout of it), TEST_ARGS (extra pytest
# arguments), DEADLINE (seconds from the start after which no stage starts
# and by which every stage is stopped, so that the logs are packed before
# the device's own limit), SOL_KERNEL_JSON (a kernel-level result for sol; default: the
# kbench stage's), STAGE_TIMEOUT (seconds per stage, default 900), PY.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PY=${PY:-python3}
STAGE_TIMEOUT=${STAGE_TIMEOUT:-900}
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build tests graph kbench sol bench demo)
summary=()
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }

run_stage() {
  local name=$1; shift
  local t0=$SECONDS limit=$STAGE_TIMEOUT
  if [ -n "${DEADLINE:-}" ]; then
    [ $((DEADLINE - SECONDS)) -lt "$limit" ] && limit=$((DEADLINE - SECONDS))
    if [ "$limit" -lt 20 ]; then
      log "stage $name skipped: DEADLINE ($DEADLINE s) reached"
      summary+=("$(printf '%-7s skipped (DEADLINE)' "$name")")
      return 1
    fi
  fi
  log "stage $name: $* (limit $limit s)"
  # SIGINT first: pytest (and the tools) then still print what passed and
  # failed so far; SIGKILL 30 s later.
  STAGE_LIMIT=$limit timeout -s INT --kill-after=30 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-7s rc=%-4s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  log "stage $name rc=$rc ($((SECONDS - t0)) s)"
  tail -n 25 "$OUT/$name.log"
  return $rc
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m
  $PY -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__)'
  $PY -m pip show nvidia-nccl-cu13 2>/dev/null | grep -i '^version'
  nvcc --version | tail -n 2
} >"$OUT/env.log" 2>&1

# The loopback stage: three matrix runs and a fault run of the loopback tool
# (run through `bash -c`, hence exported).
LOOPBACK_SIZES=4,6,100,1000,1024,4096,65536,98304,131072,262144
loopback_stage() {
  local rc=0 tool="$PY -m jax_llar.tools.loopback"
  $tool --json "$OUT/loopback.json" --sizes=$LOOPBACK_SIZES \
    --start_epochs=0,4294967270 ${LOOPBACK_ARGS:-} || rc=1
  $tool --json "$OUT/loopback-nosync.json" --no_sync --sizes=$LOOPBACK_SIZES \
    --start_epochs=0,4294967270 ${LOOPBACK_ARGS:-} || rc=1
  $tool --json "$OUT/loopback-generic.json" --generic --no_sync --worlds=2,4,8 \
    --sizes=$LOOPBACK_SIZES ${LOOPBACK_ARGS:-} || rc=1
  $tool --json "$OUT/loopback-fault.json" --skip_rank=1 --skip_call=5 --calls=8 \
    --worlds=2,5,16 --dtypes=float32 --sizes=4096 --timeout_ms=1000 \
    ${LOOPBACK_FAULT_ARGS:-} || rc=1
  $tool --json "$OUT/loopback-signature.json" --extra_call_rank=1 --fault_call=5 \
    --calls=8 --worlds=2,5,16 --dtypes=float32 --sizes=4096 --timeout_ms=10000 \
    ${LOOPBACK_FAULT_ARGS:-} || rc=1
  return $rc
}
export -f loopback_stage

KEEP=${KEEP:-/tmp/llar_keep}
mkdir -p "$KEEP"
# Store atomicity across the first two GPUs, both directions, then the split
# check (exit 0 only when it finds torn lines).
atomicity_stage() {
  local rc=0 tool="$PY -m jax_llar.tools.store_atomicity" t=${ATOMICITY_SECONDS:-60}
  $tool --writer_device 0 --reader_device 1 --max_seconds "$t" \
    --out "$OUT/store-atomicity-0to1.json" || rc=1
  $tool --writer_device 1 --reader_device 0 --max_seconds "$t" \
    --out "$OUT/store-atomicity-1to0.json" || rc=1
  $tool --writer_device 0 --reader_device 1 --split --iterations 2000 --max_seconds 30 \
    --out "$OUT/store-atomicity-split-0to1.json" || rc=1
  [ $rc -eq 0 ] && cp "$OUT"/store-atomicity-0to1.json "$OUT"/store-atomicity-1to0.json "$KEEP"/
  return $rc
}
# The tune run; the records of atomicity_stage when both directions passed.
tune_stage() {
  local sa=""
  [ -f "$KEEP/store-atomicity-0to1.json" ] && [ -f "$KEEP/store-atomicity-1to0.json" ] &&
    sa="--store_atomicity=$KEEP/store-atomicity-0to1.json,$KEEP/store-atomicity-1to0.json"
  JAX_LLAR_TUNING_DIR="$OUT/tuning" $PY -m jax_llar.tools.tune --verify \
    --results_out "$OUT" $sa ${TUNE_ARGS:-} || return 1
  mkdir -p "$KEEP/tuning" && cp "$OUT"/tuning/*.json "$KEEP/tuning/" &&
    cp "$(ls "$OUT"/*-tune.json | head -n 1)" "$KEEP/tune.json"
}
# The one-GPU suite with a prebuilt CUDA 12 extension (cu12 stage). The
# copied libraries are removed again when the stage ends (a later ensure
# stage on a warm machine must not find them); the stage fails unless the
# module it imports is the tree's and says CUDA 12.
cu12_stage() {
  [ -n "${CU12_DIR:-}" ] && [ -f "$CU12_DIR/libllar_core.so" ] ||
    { echo "cu12: CU12_DIR must hold the CUDA 12 build's libraries"; return 2; }
  $PY -m pip uninstall -y -q jax_llar >/dev/null 2>&1 || true
  trap 'rm -f jax_llar/libllar_core.so jax_llar/_llar.*.so jax_llar/_build_info.py \
    jax_llar/tools/_llar_tools.*.so' RETURN
  cp "$CU12_DIR"/libllar_core.so "$CU12_DIR"/_llar.*.so "$CU12_DIR"/_build_info.py jax_llar/ &&
    cp "$CU12_DIR"/_llar_tools.*.so jax_llar/tools/ || return 2
  PYTHONPATH=$PWD $PY -c 'import os, sys, jax_llar._build_info as b, jax_llar._ext as e
print({k: v for k, v in vars(b).items() if k.isupper()}); m = e.load()
print("extension loaded:", m is not None, e.reason() if m is None else m.__file__)
sys.exit(m is None or not b.CUDA_VERSION.startswith("12.")
         or not os.path.abspath(m.__file__).startswith(os.getcwd() + os.sep))' || return 1
  JAX_LLAR_TEST_GPU=1 PYTHONPATH=$PWD $PY -m pytest -q -rs -p no:cacheprovider \
    ${GPU1_ARGS:-} ${GPU1_TESTS:-tests/gpu1}
}
ensure_stage() {
  $PY -c 'import sys; from jax_llar import _ext; sys.exit(_ext.load() is None)' &&
    { echo "the extension loads: no build"; return 0; }
  $PY -m pip install --no-build-isolation --no-deps -v -e .
}
# The sanitize stage: the whole matrix, every run started within the stage's
# own limit (STAGE_LIMIT, from run_stage) less what its slowest run may take
# (100 s), so that the result file is written before the stage is stopped.
sanitize_stage() {
  local commit=${LLAR_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
  local max=${SANITIZE_MAX_S:-}
  if [ -z "$max" ]; then
    max=420
    [ -n "${STAGE_LIMIT:-}" ] && [ $((STAGE_LIMIT - 100)) -lt $max ] && max=$((STAGE_LIMIT - 100))
    [ "$max" -lt 10 ] && max=10
  fi
  $PY -m jax_llar.tools.sanitize --out "$OUT" --tag "-${commit:0:7}" \
    --max_seconds "$max" ${SANITIZE_ARGS:-}
}
export -f atomicity_stage tune_stage ensure_stage cu12_stage sanitize_stage
export KEEP TUNE_ARGS="${TUNE_ARGS:-}" ATOMICITY_SECONDS="${ATOMICITY_SECONDS:-60}" \
  CU12_DIR="${CU12_DIR:-}" GPU1_ARGS="${GPU1_ARGS:-}" GPU1_TESTS="${GPU1_TESTS:-}" \
  SANITIZE_ARGS="${SANITIZE_ARGS:-}" SANITIZE_MAX_S="${SANITIZE_MAX_S:-}"
export OUT PY LOOPBACK_SIZES LOOPBACK_ARGS="${LOOPBACK_ARGS:-}" \
  LOOPBACK_FAULT_ARGS="${LOOPBACK_FAULT_ARGS:-}"

for s in "${stages[@]}"; do
  case $s in
    build) run_stage build $PY -m pip install --no-build-isolation --no-deps -v -e . || break ;;
    tests) JAX_LLAR_TEST_GPU=1 JAX_LLAR_MULTIPROCESS_OUT="$OUT" run_stage tests $PY -m pytest -q -rs -p no:cacheprovider ${TEST_ARGS:-} tests/gpu ;;
    gpu1) xdist=""
          [ "${GPU1_WORKERS:-0}" -gt 0 ] && xdist="-n $GPU1_WORKERS"
          JAX_LLAR_TEST_GPU=1 run_stage gpu1 $PY -m pytest -q -rs -p no:cacheprovider \
            --durations=0 $xdist ${GPU1_ARGS:-} ${GPU1_TESTS:-tests/gpu1} ;;
    sanitize) run_stage sanitize bash -c sanitize_stage ;;
    graph) run_stage graph $PY -m jax_llar.tools.graphcheck --timeline_copy --out /tmp/llar_graphcheck ${GRAPH_ARGS:-} ;;
    kbench) run_stage kbench $PY -m jax_llar.tools.bench --level kernel --out "$OUT" ${KBENCH_ARGS:-} ;;
    sol) run_stage sol $PY -m jax_llar.tools.sol --out "$OUT" ${SOL_ARGS:-} \
           --kernel_json "${SOL_KERNEL_JSON:-$OUT/$(ls "$OUT" | grep -m1 -- '-kernel.json$')}" ;;
    bench) run_stage bench $PY -m jax_llar.tools.bench --level jax --out "$OUT" ${BENCH_ARGS:-} ;;
    flags) run_stage flags $PY -m jax_llar.tools.bench --level jax --out "$OUT" --psum_flags --tag=-flags ${FLAGS_ARGS:-} ;;
    demo) run_stage demo $PY examples/tp_decode/main.py --json "$OUT/demo.json" ${DEMO_ARGS:-} ;;
    sweep) run_stage sweep $PY examples/tp_decode/main.py --batches=1,2,4,8,16,32,64 --psum_flags= --json "$OUT/sweep.json" ${SWEEP_ARGS:-} ;;
    loop) run_stage loop $PY -m jax_llar.tools.bench --level loop --out "$OUT" ${LOOP_ARGS:-} ;;
    loopflags) run_stage loopflags $PY -m jax_llar.tools.bench --level loop --loop_flags --sizes=1024 --flag_timeout=420 --tag=-flags --out "$OUT" ${LOOPFLAGS_ARGS:-} ;;
    cg) run_stage cg $PY examples/cg_solver/main.py --out "$OUT" ${CG_ARGS:-} ;;
    loopback) run_stage loopback bash -c loopback_stage ;;
    ensure) run_stage ensure bash -c ensure_stage || break ;;
    cu12) run_stage cu12 bash -c cu12_stage ;;
    atomicity) run_stage atomicity bash -c atomicity_stage ;;
    tune) run_stage tune bash -c tune_stage ;;
    verify) JAX_LLAR_TUNING_DIR="$KEEP/tuning" run_stage verify $PY -m jax_llar.tools.tune \
              --verify_from "$KEEP/tune.json" --results_out "$OUT" ${TUNE_ARGS:-} ;;
    soak) run_stage soak $PY -m jax_llar.tools.soak --out "$OUT" ${SOAK_ARGS:---calls=2200000} ;;
    *) log "unknown stage $s" ;;
  esac
done

echo "==== summary ===="
printf '%s\n' "${summary[@]}"
grep -E "passed|failed|error" "$OUT/tests.log" 2>/dev/null | tail -n 3
grep -E "passed|failed|error" "$OUT/gpu1.log" 2>/dev/null | tail -n 3
grep -E "passed|failed|error|CUDA_VERSION|extension loaded" "$OUT/cu12.log" 2>/dev/null | tail -n 4
grep -E "us/call" "$OUT/kbench.log" 2>/dev/null | head -n 40
grep -E "SoL|one-shot kernel|_ns|_us " "$OUT/sol.log" 2>/dev/null
grep -A30 "^dtype " "$OUT/bench.log" 2>/dev/null | head -n 22
grep -A12 "^lax.psum under XLA flags" "$OUT/flags.log" 2>/dev/null
grep -A30 "^inter-token latency" "$OUT/demo.log" 2>/dev/null
tail -n 45 "$OUT/loop.log" 2>/dev/null
grep -E '"in_command_buffer": (true|false)' "$OUT/graph.log" 2>/dev/null | tail -n 1
grep -E "^(cases:|stopped:|note:)| (FAIL|ERROR)" "$OUT/loopback.log" 2>/dev/null | head -n 40
grep -E "^(sanitizer errors|units:)| FAIL " "$OUT/sanitize.log" 2>/dev/null | head -n 30
grep -E "^soak (PASSED|FAILED)" "$OUT/soak.log" 2>/dev/null
grep -E "torn|verdict|passed|FAILED" "$OUT/atomicity.log" 2>/dev/null | tail -n 6
grep -E "ranks: |lax.psum: |best single|up to 1 MiB|^\[verify" "$OUT/tune.log" "$OUT/verify.log" 2>/dev/null | tail -n 40
# The device tool returns at most 8 files: pack the logs into one.
(cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
