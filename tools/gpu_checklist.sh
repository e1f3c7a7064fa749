#!/usr/bin/env bash
# The GPU checklist as pytest invocations, one part per argument; writes only under $OUT.
#
#   bash tools/gpu_checklist.sh parity gpu-tests sanitize bench sweep fit model
#   OUT=/tmp/h200 bash tools/gpu_checklist.sh bench sweep fit    # the device's report and policy evidence
#
# parity     the oracle's plugin on optimized.specs:triton, :skinny and :hybrid, tier full, -n 2
# gpu-tests  the GPU tests: test_gpu_reliability.py, test_skinny_gpu.py, the -m gpu cells of
#            test_linear.py and test_model.py, test_fuzz.py (W4A16_FUZZ, default long)
# sanitize   compute-sanitizer memcheck and racecheck around the -m sanitize selections
# bench      the benchmark matrix -> $OUT/bench.json and $OUT/report/
# sweep      the tuning sweep (triton, skinny, transient, dense, triton@all, skinny@all at every M)
#            -> $OUT/sweep.json
# fit        python3 -m tools.fit_policy on those: $OUT/fit/ and the proposed policy file
#            $OUT/fit/<device>.json (copy it to optimized/policies/ to adopt it)
# model      the end-to-end Llama-3.1-8B run (python3 -m tests.benchmarks.model_e2e) ->
#            $OUT/model/model_e2e.json, then $OUT/report/ over it and $OUT/bench.json if there.
#            Needs transformers: carry its wheels in .whl/ (docs/model.md lists them).
#
# Environment: OUT (default: a new temporary folder), W4A16_FUZZ (gpu-tests), BENCH_BUDGET_S and
# SWEEP_BUDGET_S (seconds each benchmark run may start cells for, default 420: with the build, each
# part fits in one 10-minute command on a lent device), SWEEP_PROVIDERS,
# SWEEP_M, SWEEP_SHAPES (the sweep's selection), MODEL_ARGS (extra model_e2e arguments). gemlite
# is a peer only when importable: put its wheel in .whl/ (`pip wheel --no-deps gemlite==0.6.0.post2`)
# and it is installed under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"
  exit 2
fi
out=${OUT:-$(mktemp -d -t w4a16-checklist.XXXXXX)}
mkdir -p "$out"
echo "writing under $out"
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX="$out/pycache"
export HYPOTHESIS_STORAGE_DIRECTORY="$out/hypothesis"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$out/site" .whl/*.whl &&
    export PYTHONPATH="$out/site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# The oracle's pytest plugin, unless the installed package already registers it.
plugin=$(python3 -c "from importlib.metadata import entry_points
print('' if any(e.value == 'oracle.pytest_plugin' for e in entry_points(group='pytest11')) else '-p oracle.pytest_plugin')")
pytest=(python3 -m pytest -p no:cacheprovider -q -rs)

build_skinny() {  # once, outside the sanitizer: prints why it cannot run, if it cannot
  python3 -c "from optimized import skinny; print('skinny kernel available:', skinny.is_available())"
}

sanitize() {  # sanitize TOOL NAME PYTEST-ARGS...: one compute-sanitizer run, its log under $out
  local tool=$1 name=$2 rc
  shift 2
  compute-sanitizer --tool "$tool" --error-exitcode 3 "${pytest[@]}" -x "$@" > "$out/${tool}_$name.log" 2>&1
  rc=$?
  tail -4 "$out/${tool}_$name.log"
  echo "$tool $name: exit $rc"
  return $rc
}

part_parity() {
  # optimized/specs.py holds no tests: the items are the plugin's parity cases alone.
  "${pytest[@]}" $plugin optimized/specs.py -n 2 --w4a16-tier full --w4a16-kernel=optimized.specs:triton \
    --w4a16-kernel=optimized.specs:skinny --w4a16-kernel=optimized.specs:hybrid --junitxml="$out/parity.xml"
}

part_gpu_tests() {
  build_skinny
  local files=(tests/optimized/test_gpu_reliability.py)
  [ -e tests/optimized/test_skinny_gpu.py ] && files+=(tests/optimized/test_skinny_gpu.py)
  "${pytest[@]}" "${files[@]}" --junitxml="$out/gpu_tests.xml" || return
  # W4A16Linear in a CUDA graph, and the tiny Llama on the device (its cells skip without transformers).
  "${pytest[@]}" tests/optimized/test_linear.py tests/optimized/test_model.py -m gpu --junitxml="$out/model_tests.xml" \
    || return
  W4A16_FUZZ=${W4A16_FUZZ:-long} "${pytest[@]}" tests/optimized/test_fuzz.py --junitxml="$out/fuzz.xml"
}

part_sanitize() {
  build_skinny
  local rc=0
  sanitize memcheck triton tests/optimized/test_gpu_reliability.py -m sanitize || rc=1
  sanitize racecheck triton tests/optimized/test_gpu_reliability.py -m sanitize -k bf16 || rc=1
  if [ -e tests/optimized/test_skinny_gpu.py ]; then
    sanitize memcheck skinny tests/optimized/test_skinny_gpu.py -m sanitize || rc=1
    sanitize racecheck skinny tests/optimized/test_skinny_gpu.py -m sanitize || rc=1
  else
    echo "tests/optimized/test_skinny_gpu.py is not in this checkout: the skinny kernel is not sanitized"
    rc=1
  fi
  return $rc
}

part_bench() {
  local golden rc=0
  golden=$(python3 -c "import torch; from tests.benchmarks.golden import golden_path
print(golden_path(torch.cuda.get_device_name()))") || return
  [ -e "$out/golden.json" ] || { [ -e "$golden" ] && cp "$golden" "$out/golden.json"; }
  # The report's run: every provider, the default cells, goldens compared and merged into a copy.
  W4A16_BENCH_BUDGET_S=${BENCH_BUDGET_S:-420} "${pytest[@]}" tests/benchmarks/test_decode_block.py \
    tests/benchmarks/test_matmul.py --benchmark-only --bench-golden "$out/golden.json" --update-golden \
    --benchmark-json="$out/bench.json" || rc=1
  python3 -m oracle report "$out/bench.json" --out "$out/report" || rc=1
  return $rc
}

part_sweep() {
  # The tuning sweep for tools/fit_policy.py: forced tiles and kernels beside the choices they inform.
  W4A16_BENCH_BUDGET_S=${SWEEP_BUDGET_S:-420} "${pytest[@]}" tests/benchmarks/test_matmul.py --benchmark-only \
    --bench-providers "${SWEEP_PROVIDERS:-triton,skinny,transient,dense,triton@all,skinny@all}" --bench-m "${SWEEP_M:-all}" \
    --bench-shapes "${SWEEP_SHAPES:-default}" --bench-golden "$out/no-golden.json" \
    --benchmark-json="$out/sweep.json"
}

part_fit() {
  local inputs=()
  for f in "$out/bench.json" "$out/sweep.json"; do [ -e "$f" ] && inputs+=("$f"); done
  [ ${#inputs[@]} -gt 0 ] || { echo "no $out/bench.json or sweep.json: run the bench or sweep part first"; return 1; }
  local device
  device=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['machine_info']['w4a16']['gpu'])" "${inputs[0]}")
  local name
  name=$(python3 -c "import sys; from optimized.policy import policy_for; print(policy_for(sys.argv[1]).name)" "$device")
  python3 -m tools.fit_policy "${inputs[@]}" --out "$out/fit" --policy-out "$out/fit/$name.json"
}

part_model() {
  local rc=0 inputs=()
  python3 -m tests.benchmarks.model_e2e --out "$out/model" ${MODEL_ARGS:-} || rc=1
  [ -e "$out/bench.json" ] && inputs+=("$out/bench.json")
  [ -e "$out/model/model_e2e.json" ] && inputs+=("$out/model/model_e2e.json")
  [ ${#inputs[@]} -gt 0 ] && { python3 -m oracle report "${inputs[@]}" --out "$out/report" || rc=1; }
  return $rc
}

status=0
for part in "$@"; do
  echo "=== $part"
  start=$SECONDS
  case $part in
    parity) part_parity ;;
    gpu-tests) part_gpu_tests ;;
    sanitize) part_sanitize ;;
    bench) part_bench ;;
    sweep) part_sweep ;;
    fit) part_fit ;;
    model) part_model ;;
    *) echo "unknown part $part (parts: parity gpu-tests sanitize bench sweep fit model)"; false ;;
  esac
  rc=$?
  echo "=== $part: exit $rc, $((SECONDS - start)) s"
  [ $rc -eq 0 ] || status=1
done
echo "results under $out"
exit $status
