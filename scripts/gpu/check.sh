#!/usr/bin/env bash
# The GPU checks, for a machine with one NVIDIA GPU and PyTorch's CUDA wheels but no Rust:
# run from the repository root with a `tessel` built here with `--features cuda` (TESSEL_BIN)
# and the runtime's `launcher_backends` test binary (TESSEL_TEST_BIN), writing under $OUT.
#  1. the CUDA backend's single-rank test against the threaded CPU run;
#  2. `tessel launch --backend cuda` against `--backend cpu` on single-rank plans of
#     scripts/gpu/plans/ (dense GELU/LayerNorm, SwiGLU/RMSNorm/RoPE/GQA, MoE, recompute):
#     the losses of each step and the step times;
#  3. a bf16 GEMM sweep through PyTorch (scripts/gpu/gemm_sweep.py) and a profiler trace.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
BIN=${TESSEL_BIN:-target/release/tessel}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# cudarc asks first for the unversioned names (libcublas.so, ...): point them at the CUDA
# libraries PyTorch ships, whatever their major version.
LIBS=/tmp/tessel-culibs
mkdir -p "$LIBS"
dirs=""
for name in cublas cublasLt nvrtc nccl; do
  f=$(find /opt /usr/local /usr/lib -name "lib$name.so.[0-9]*" 2>/dev/null | grep -v stubs | sort -V | tail -1)
  echo "lib$name: ${f:-not found}"
  [ -n "$f" ] && ln -sf "$f" "$LIBS/lib$name.so" && dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$LIBS$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ -n "${TESSEL_TEST_BIN:-}" ]; then
  echo "== launcher_backends (CUDA vs CPU, single rank)"
  timeout 120 "$TESSEL_TEST_BIN" --nocapture 2>&1 | tee "$OUT/launcher_backends.txt" | tail -15
fi

for plan in scripts/gpu/plans/*.json; do
  name=$(basename "$plan" .json)
  for backend in cuda cpu; do
    echo "== $name on $backend"
    timeout 120 "$BIN" launch "$plan" --backend "$backend" --steps 6 --format json \
      >"$OUT/$name.$backend.json" 2>"$OUT/$name.$backend.err"
    echo "exit $?"; tail -3 "$OUT/$name.$backend.err"
  done
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os, re, statistics
out = sys.argv[1]
# CPU: `--format json` (losses, step_time_s); CUDA: rank 0's `step N  loss L  time T s` lines.
print(f"{'plan':<24}{'max |dloss|/loss':>18}{'cuda step ms':>14}{'cpu step ms':>13}")
for cpu_file in sorted(glob.glob(f"{out}/*.cpu.json")):
    name = os.path.basename(cpu_file)[:-9]
    try:
        cpu = json.load(open(cpu_file))
        rows = re.findall(r"loss ([0-9.eE+-]+)\s+time ([0-9.eE+-]+) s", open(f"{out}/{name}.cuda.json").read())
        gl = [float(l) for l, _ in rows]; gt = [float(t) for _, t in rows]
        cl, ct = cpu["losses"], cpu["step_time_s"]
        diff = max(abs(g - c) / abs(c) for g, c in zip(gl, cl))
        print(f"{name:<24}{diff:>18.2e}{statistics.median(gt[1:])*1e3:>14.2f}{statistics.median(ct[1:])*1e3:>13.2f}")
        print("   cuda", gl); print("   cpu ", cl)
    except Exception as e:
        print(f"{name:<24} no result ({e!r})")
PY

echo "== GEMM sweep"
timeout 240 python3 scripts/gpu/gemm_sweep.py "$OUT/gemm.csv" "$OUT/mm_trace.json" >"$OUT/gemm.log" 2>&1
echo "exit $?"; tail -5 "$OUT/gemm.log"
