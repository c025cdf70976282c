#!/usr/bin/env bash
# The GPU check: one prepared run for a machine with one CUDA GPU and no network (Python 3.12, torch 2.11+ with
# CUDA, no apt, so no Catch2; maybe no ninja or ccache). It
#   1. records the machine (python, torch, CUDA, GPU, NCCL, build tools)     -> env.json
#   2. builds tunedist offline with the NCCL side (cmake; Ninja if present, else make) into python/tunedist/
#   3. runs the GPU tests at world size 1 (NCCL refuses two ranks on one GPU): tests/python/test_cuda_nccl.py, and
#      the hooks on CUDA with their CUDA kernels (tests/python/test_hooks*.py -k cuda: test_hooks_cuda.py; the
#      kernels are built where the machine has nvcc, else the hooks use ATen's ops and those tests say so)
#   4. runs tunedist.bench on CUDA buffers, `tuned` against torch's `nccl`, at world size 1 -> bench_cuda.json
# and writes gpu_check.json (every step: command, exit code, seconds, last lines of its log) plus the logs into
# $OUT (or ./gpu_results). Every step has its own timeout; the whole run stays under 6.5 minutes.
#
#   benchmarks/gpu_check.sh             # the full check
#   benchmarks/gpu_check.sh --dry-run   # steps 1 and 2's configure only (no build, no GPU needed): shows what
#                                       # would be built and run
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${OUT:-$ROOT/gpu_results}"
BUILD_DIR="${TUNEDIST_GPU_BUILD_DIR:-${TMPDIR:-/tmp}/tunedist-gpu-build}"
PY="${PYTHON:-python3}"
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

# Per-step limits (seconds), each cut to what is left of a 380 s budget for the whole run, so it ends within
# 6.5 minutes whatever hangs. Expected on 16 idle cores: configure ~15 s, build ~1 min, tests ~1 min, hooks ~45 s,
# bench ~30 s (a cold GPU: each process pays a CUDA context and NCCL's start).
# (Each can be overridden from the environment, e.g. for the dry-run test on a loaded CI machine.)
T_ENV=${T_ENV:-30} T_CONFIGURE=${T_CONFIGURE:-90} T_BUILD=${T_BUILD:-180} T_TESTS=${T_TESTS:-100}
T_HOOKS=${T_HOOKS:-90} T_BENCH=${T_BENCH:-60}
DEADLINE=$(( $(date +%s) + ${TUNEDIST_GPU_CHECK_BUDGET_S:-380} ))

mkdir -p "$OUT_DIR"
STEPS_FILE="$OUT_DIR/steps.jsonl"
: > "$STEPS_FILE"
FAILED=0

# run_step NAME TIMEOUT CMD...: runs CMD under `timeout`, logs to $OUT_DIR/NAME.log, appends a JSON line.
run_step() {
  local name="$1" limit="$2"
  shift 2
  local log="$OUT_DIR/$name.log" start end rc
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 5 ]; then
    echo "== $name: skipped, the run's time budget is spent"
    echo "{\"step\": \"$name\", \"command\": \"$*\", \"rc\": 124, \"timed_out\": true, \"seconds\": 0, \"log_tail\": \"skipped: budget spent\"}" >> "$STEPS_FILE"
    FAILED=1
    return 124
  fi
  [ "$left" -lt "$limit" ] && limit="$left"
  echo "== $name (limit ${limit}s): $*"
  start=$(date +%s.%N)
  # The steps are shell functions (exported below), so timeout runs them in a child bash.
  timeout --signal=TERM --kill-after=10 "$limit" bash -c '"$@"' bash "$@" > "$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  "$PY" - "$name" "$rc" "$start" "$end" "$log" "$*" >> "$STEPS_FILE" <<'EOF'
import json, sys
name, rc, start, end, log, cmd = sys.argv[1:]
tail = open(log, errors="replace").read()[-3000:]
rc = int(rc)
print(json.dumps({"step": name, "command": cmd, "rc": rc, "timed_out": rc in (124, 137),
                  "seconds": round(float(end) - float(start), 1), "log_tail": tail}))
EOF
  echo "   rc=$rc ($(tail -n 1 "$log" | cut -c1-160))"
  [ "$rc" -eq 0 ] || FAILED=1
  return "$rc"
}

describe_machine() {
  "$PY" - "$OUT_DIR/env.json" <<'EOF'
import json, os, shutil, subprocess, sys, sysconfig
import torch
site = os.path.dirname(os.path.dirname(torch.__file__))
info = {
    "python": sys.version.split()[0],
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
    "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    "torch_nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
    "nccl_headers_in_wheel": os.path.isfile(os.path.join(site, "nvidia", "nccl", "include", "nccl.h")),
    "cmake": shutil.which("cmake"), "ninja": shutil.which("ninja"), "make": shutil.which("make"),
    "ccache": shutil.which("ccache"), "nvcc": shutil.which("nvcc"),
    "pytest": __import__("importlib").util.find_spec("pytest") is not None,
    "cpus": os.cpu_count(),
}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader"], capture_output=True, text=True,
                                        timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    info["nvidia_smi"] = None
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
EOF
}

configure() {
  local generator=("-G" "Unix Makefiles")
  command -v ninja > /dev/null && generator=("-G" "Ninja")
  local launcher=()
  command -v ccache > /dev/null && launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
  local prefix
  prefix="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" || return 1
  local args=("${generator[@]}" ${launcher[@]+"${launcher[@]}"} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH="$prefix" -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')"
    -DTUNEDIST_USE_NCCL=ON -DTUNEDIST_BUILD_TESTS=OFF)
  # The CUDA kernels for this machine's GPU only (the package default builds five architectures): a shorter build.
  local arch
  arch="$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}{n}-real")' 2>/dev/null)" &&
    args+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
  # A fresh cache: a build dir from another torch, Python or compiler must not leak in.
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
  local log="$BUILD_DIR.configure.log"
  mkdir -p "$BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" "${args[@]}" 2>&1 | tee "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] && return 0
  # The GPU machine's default compiler (/opt/gcc/bin/g++ there, 2026-12-04) links libstdc++ statically, which
  # crashes next to torch (cmake/tunedistLibstdcxx.cmake refuses it): retry once with the system's compiler.
  if grep -q "links libstdc++ statically" "$log" && [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then
    echo "gpu_check: retrying configure with the system compiler /usr/bin/g++ (the default links libstdc++ statically)"
    rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
    cmake -S "$ROOT" -B "$BUILD_DIR" "${args[@]}" -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_C_COMPILER=/usr/bin/gcc \
      -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++
    return
  fi
  return 1
}

build() {
  cmake --build "$BUILD_DIR" --target _C tunedist --parallel "$(nproc)" || return 1
  # Next to the sources, where tests/python/conftest.py finds the package (*.so is git-ignored).
  local f
  for f in "$BUILD_DIR"/_C*.so "$BUILD_DIR"/libtunedist.so; do
    cp "$f" "$ROOT/python/tunedist/.$(basename "$f").tmp" && mv "$ROOT/python/tunedist/.$(basename "$f").tmp" \
      "$ROOT/python/tunedist/$(basename "$f")" || return 1
  done
  local check='import tunedist; print(tunedist.version(), tunedist._C.nccl_build_info())'
  PYTHONPATH="$ROOT/python" "$PY" -X faulthandler -c "$check" && return 0
  local rc=$?
  # A crash in native code (a segfault while loading _C, say) gets its native backtrace in this log, so one run
  # says why.
  local debugger
  debugger="$(command -v gdb || command -v cuda-gdb)"
  if [ "$rc" -ge 128 ] && [ -n "$debugger" ]; then
    echo "import crashed (exit $rc): native backtrace from $debugger"
    PYTHONPATH="$ROOT/python" timeout 90 "$debugger" -q -batch -ex run -ex bt \
      --args "$("$PY" -c 'import sys; print(sys.executable)')" -c "$check" 2>&1 |
      grep -v '^\[New Thread\|^\[Thread' | head -80
  fi
  return "$rc"
}

gpu_tests() {
  # (Not the dry-run test: this run is the real thing.)
  # Not the configure tests either (CI's CPU machine runs them; here they would spend a third of the step), and
  # launches capped below the step's limit, so a hang reports the ranks' stacks before the step is killed.
  cd "$ROOT" && TUNEDIST_EXPECT_NCCL=1 NCCL_DEBUG=WARN TUNEDIST_TEST_LAUNCH_TIMEOUT_S=60 TUNEDIST_TEST_PG_TIMEOUT_S=30 \
    PYTHONPATH="$ROOT/python" "$PY" -m pytest -v -rs -k "not dry_run and not configure and not compiler" \
    tests/python/test_cuda_nccl.py --junitxml="$OUT_DIR/test_cuda_nccl.xml"
}

hooks_cuda_tests() {
  shopt -s nullglob
  local files=("$ROOT"/tests/python/test_hooks*.py)
  if [ ${#files[@]} -eq 0 ]; then
    echo "no tests/python/test_hooks*.py in this tree: nothing to run"
    return 0
  fi
  cd "$ROOT" && NCCL_DEBUG=WARN TUNEDIST_TEST_LAUNCH_TIMEOUT_S=80 TUNEDIST_TEST_PG_TIMEOUT_S=40 \
    PYTHONPATH="$ROOT/python" "$PY" -m pytest -v -rs -k "cuda and not configure" "${files[@]}" \
    --junitxml="$OUT_DIR/test_hooks_cuda.xml"
  local rc=$?
  # pytest's 5 = no test selected (a tree from before test_hooks_cuda.py): say so instead of failing.
  [ "$rc" -eq 5 ] && { echo "no CUDA tests among ${files[*]}"; return 0; }
  return "$rc"
}

gpu_bench() {
  # --local-addr: --standalone would otherwise publish the host's FQDN, which a machine without network may not
  # resolve.
  cd "$ROOT" && NCCL_DEBUG=WARN PYTHONPATH="$ROOT/python" "$PY" -m torch.distributed.run --standalone \
    --local-addr=127.0.0.1 --nproc_per_node=1 \
    -m tunedist.bench --device cuda --backends tuned,nccl --ops all_reduce,all_gather,reduce_scatter,broadcast \
    -b 8 -e 64M -f 8 --target-s 0.05 --rounds 1 --no-progress --json "$OUT_DIR/bench_cuda.json"
}

summarize() {
  "$PY" - "$STEPS_FILE" "$OUT_DIR/gpu_check.json" "$DRY_RUN" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {"dry_run": sys.argv[3] == "1", "ok": all(s["rc"] == 0 for s in steps), "steps": steps}
try:
    out["env"] = json.load(open(sys.argv[2].replace("gpu_check.json", "env.json")))
except OSError:
    pass
json.dump(out, open(sys.argv[2], "w"), indent=1)
print("gpu_check:", "OK" if out["ok"] else "FAILED", {s["step"]: s["rc"] for s in steps})
EOF
}

export ROOT OUT_DIR BUILD_DIR PY DRY_RUN
export -f describe_machine configure build gpu_tests hooks_cuda_tests gpu_bench

run_step env "$T_ENV" describe_machine
if [ "$DRY_RUN" -eq 1 ]; then
  run_step configure "$T_CONFIGURE" configure
  echo "dry run: would build (cmake --build $BUILD_DIR --target _C tunedist), then run gpu_tests," \
       "hooks_cuda_tests (-k cuda) and gpu_bench (tuned vs nccl on cuda, world size 1)"
else
  if run_step configure "$T_CONFIGURE" configure && run_step build "$T_BUILD" build; then
    run_step gpu_tests "$T_TESTS" gpu_tests
    run_step hooks_cuda_tests "$T_HOOKS" hooks_cuda_tests
    run_step gpu_bench "$T_BENCH" gpu_bench
  fi
fi
summarize
exit "$FAILED"
