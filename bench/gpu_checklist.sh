#!/usr/bin/env bash
# The whole GPU checklist in one call: parity, compute-sanitizer, benchmarks.
#   bash bench/gpu_checklist.sh                 # every part but the *-variants, results in bench/results/h200/
#   PARTS="skinny triton" OUT=/tmp/x bash bench/gpu_checklist.sh
# All default parts together run well past a 10-minute command limit: there, run them in groups
# with PARTS (bench/results/h200/README.md lists the groups that fit).
# Parts: skinny (build, opcheck, decode parity, timing), skinny-errors (the raw op's TORCH_CHECKs
# on the device, and every forced stream split, a child process a case: bench/skinny_errors_h200.py),
# torch-check-probe (not a default part: whether extension code built on this machine can stream a
# number into an error message, bench/torch_check_probe.py),
# skinny-sanitize (memcheck on boundary shapes), skinny-overlap (programmatic dependent launch: the
# graph chain check and each overlap mode's timing, bench/overlap_h200.py), triton (full parity matrix, then timing against
# the peers for the rest of TRITON_BUDGET_S), triton-sanitize, skinny-variants and
# triton-variants (compare kernel variants / tile candidates, for retuning), skinny-stream-split
# (the stream variant's planned K split against every forced split); reliability (issue 8:
# long fuzz run, large indices, determinism; bench/reliability_h200.py), reliability-memcheck and
# racecheck (its sanitizer sweep of both kernels under memcheck / racecheck, one log per tool and
# kernel family; racecheck is slow, so it takes the small sweep); hybrid (the hybrid op: opcheck
# and the full parity matrix in HYBRID_SHARDS processes); bench-decode and bench-prefill (the
# pytest-benchmark suite, every provider side by side, merged into fixtures/golden/h200.json).
# gemlite is a peer only when importable: carry its wheel in .whl/ (see bench/results/h200/README.md).
set -uo pipefail
out=${OUT:-bench/results/h200}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0
for part in ${PARTS:-skinny skinny-errors skinny-sanitize skinny-overlap triton triton-sanitize hybrid bench-decode bench-prefill reliability reliability-memcheck racecheck}; do
  echo "=== $part ($(date +%T))"
  case $part in
    skinny) python3 bench/skinny_h200.py --out "$out" ;;
    skinny-errors) python3 bench/skinny_errors_h200.py --out "$out" --isolate 2>&1 | tee "$out/skinny_errors_log.txt"
                   (exit "${PIPESTATUS[0]}") ;;
    torch-check-probe) python3 bench/torch_check_probe.py --out "$out" ;;
    skinny-sanitize) compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/skinny_h200.py --sanitize \
                       --out "$out" > "$out/skinny_sanitize.log" 2>&1; tail -5 "$out/skinny_sanitize.log" ;;
    triton) python3 bench/triton_h200.py --out "$out" --sections parity,timing --budget-s "${TRITON_BUDGET_S:-450}" ;;
    skinny-variants) python3 bench/skinny_h200.py --variants --out "$out" ;;
    skinny-stream-split) python3 bench/stream_split_h200.py --out "$out" 2>&1 | tee "$out/stream_split_log.txt" ;;
    skinny-overlap) python3 bench/overlap_h200.py --out "$out" 2>&1 | tee "$out/overlap_log.txt" ;;
    triton-variants) python3 bench/triton_h200.py --sections variants --out "$out" ;;
    triton-sanitize) compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/triton_h200.py --sanitize \
                       --out "$out" > "$out/triton_sanitize.log" 2>&1; tail -5 "$out/triton_sanitize.log" ;;
    reliability) python3 bench/reliability_h200.py --out "$out" 2>&1 | tee "$out/reliability_log.txt" ;;
    reliability-memcheck) compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/reliability_h200.py \
                            --sanitize full > "$out/reliability_memcheck.log" 2>&1; rc=$?
                          tail -5 "$out/reliability_memcheck.log"; (exit $rc) ;;
    racecheck) rc=0
               for kernels in skinny,skinny-simt triton; do
                 log="$out/racecheck_${kernels%%,*}.log"
                 compute-sanitizer --tool racecheck --error-exitcode 3 python3 bench/reliability_h200.py \
                   --sanitize small --kernels "$kernels" > "$log" 2>&1 || rc=$?
                 tail -5 "$log"
               done
               (exit $rc) ;;
    hybrid) python3 bench/hybrid_h200.py --out "$out" --sections opcheck,parity --shards "${HYBRID_SHARDS:-4}" \
              --budget-s "${HYBRID_BUDGET_S:-480}" ;;
    bench-decode|bench-prefill)
      ms=$([ "$part" = bench-decode ] && echo 1,4,16 || echo 128,1024,4096)
      # The block proxy first: cells past W4A16_BENCH_BUDGET_S skip, and it has the fewest.
      [ -e "$out/golden_h200.json" ] || cp fixtures/golden/h200.json "$out/golden_h200.json"  # both parts merge into it
      python3 -m pytest tests/benchmarks/test_decode_block.py tests/benchmarks/test_matmul.py --benchmark-only -q \
        -p no:cacheprovider --bench-m "$ms" --bench-golden "$out/golden_h200.json" --update-golden \
        --benchmark-json="$out/${part#bench-}.json" 2>&1 | tee "$out/${part}_log.txt" ;;
    *) echo "unknown part $part"; false ;;
  esac || { echo "part $part failed with $?"; status=1; }
done
exit $status
