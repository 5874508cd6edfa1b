"""Runs one large bf16 GEMM back to back for a while and records, every second, the rate it
reached over that second with the GPU's SM clock, power draw and temperature (nvidia-smi). It
shows how far a GEMM's rate under sustained load falls below the first seconds', the gap
between a short benchmark and a training step. The inputs are N(0, STD²): a GEMM's power, and so
its clock under the cap, depends on the bits it multiplies (trained weights are ~N(0, 0.02²)).

Usage: python3 scripts/gpu/sustained_gemm.py OUT.csv [SECONDS] [N] [STD] [M K]
(an M×K by K×N product; M and K default to N, STD to 1)"""

import csv
import subprocess
import sys
import time

import torch


def smi():
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
         "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=True).stdout.strip()
    return [f.strip() for f in out.split(",")]


def main():
    out = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    std = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    m = int(sys.argv[5]) if len(sys.argv) > 5 else n
    k = int(sys.argv[6]) if len(sys.argv) > 6 else n
    a = (torch.randn(m, k, device="cuda") * std).to(torch.bfloat16)
    b = (torch.randn(k, n, device="cuda") * std).to(torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    flops = 2 * m * n * k
    name = torch.cuda.get_device_name(0)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "m", "n", "k", "input_std", "second", "gemms", "tflops", "sm_clock_mhz", "power_w",
                    "temperature_c", "throttle_reasons"])
        start = time.time()
        second = 0
        while time.time() - start < seconds:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            count = 0
            begin.record()
            t0 = time.time()
            while time.time() - t0 < 1.0:
                for _ in range(8):
                    torch.matmul(a, b, out=c)
                count += 8
                torch.cuda.synchronize() if count % 64 == 0 else None
            end.record()
            end.synchronize()
            ms = begin.elapsed_time(end)
            clock, power, temp, reasons = smi()
            w.writerow([name, m, n, k, std, second, count, f"{count * flops / (ms * 1e-3) / 1e12:.1f}",
                        clock, power, temp, reasons])
            f.flush()
            second += 1


if __name__ == "__main__":
    main()
