#!/usr/bin/env bash
# The whole GPU checklist in one call: parity, compute-sanitizer, benchmarks.
#   bash bench/gpu_checklist.sh                 # everything, results in bench/results/h200/
#   PARTS="skinny triton" OUT=/tmp/x bash bench/gpu_checklist.sh
# Parts: skinny (build, opcheck, decode parity, timing), skinny-sanitize (memcheck on boundary
# shapes), triton (full parity matrix, timing vs peers, tile sweep), triton-sanitize.
# gemlite is a peer only when importable: carry its wheel in .whl/ (see bench/README.md).
set -uo pipefail
out=${OUT:-bench/results/h200}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$out/gpu.txt" 2>&1
status=0
for part in ${PARTS:-skinny skinny-sanitize triton triton-sanitize}; do
  echo "=== $part ($(date +%T))"
  case $part in
    skinny) python3 bench/skinny_h200.py --out "$out" ;;
    skinny-sanitize) compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/skinny_h200.py --sanitize \
                       --out "$out" > "$out/skinny_sanitize.log" 2>&1; tail -5 "$out/skinny_sanitize.log" ;;
    triton) python3 bench/triton_h200.py --out "$out" ;;
    triton-sanitize) compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/triton_h200.py --sanitize \
                       --out "$out" > "$out/triton_sanitize.log" 2>&1; tail -5 "$out/triton_sanitize.log" ;;
    *) echo "unknown part $part"; false ;;
  esac || { echo "part $part failed with $?"; status=1; }
done
exit $status
