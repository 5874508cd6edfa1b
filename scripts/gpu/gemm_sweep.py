"""Times bf16 GEMMs through PyTorch (cuBLAS) on the GPU it runs on, for the GEMM primitive.

Writes `m,n,k,dtype,time_us,tflops` rows (the CSV `tessel calibrate` reads) to argv[1], and a
PyTorch profiler trace of a few of the same products, recorded with shapes, to argv[2].
Each shape: fresh random inputs (never zeros), rotated over enough sets to leave L2, 5 warm-up
products, then the median of 20 products timed one by one with CUDA events.
"""
import statistics
import sys

import torch

dev = torch.device("cuda")
props = torch.cuda.get_device_properties(dev)
L2 = getattr(props, "L2_cache_size", 64 << 20)


def shapes():
    # Transformer training GEMMs (tokens m; hidden h): QKV, attention output, MLP up and down,
    # then squares.
    for h in (1024, 2048, 4096, 8192, 12288):
        for m in (1024, 4096, 16384):
            yield (m, 3 * h, h)
            yield (m, h, h)
            yield (m, 4 * h, h)
            yield (m, h, 4 * h)
    for s in (256, 512, 1024, 2048, 4096, 8192, 16384):
        yield (s, s, s)


def time_gemm(m, n, k):
    bytes_per_set = 2 * (m * k + k * n + m * n)
    sets = max(1, min(8, (2 * L2) // bytes_per_set + 1))
    a = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    b = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    c = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    for i in range(5):
        torch.matmul(a[i % sets], b[i % sets], out=c[i % sets])
    times = []
    for i in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a[i % sets], b[i % sets], out=c[i % sets])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main():
    rows = []
    seen = set()
    for m, n, k in shapes():
        if (m, n, k) in seen:
            continue
        seen.add((m, n, k))
        us = time_gemm(m, n, k)
        tflops = 2 * m * n * k / (us * 1e-6) / 1e12
        rows.append((m, n, k, us, tflops))
        print(f"{m:6d} {n:6d} {k:6d} {us:10.2f} us {tflops:7.1f} TFLOP/s", flush=True)
    with open(sys.argv[1], "w") as f:
        f.write(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
                f"cuBLAS via torch.matmul, bf16 in and out, median of 20 after 5 warm-ups\n")
        f.write("m,n,k,dtype,time_us,tflops\n")
        for m, n, k, us, tflops in rows:
            f.write(f"{m},{n},{k},bf16,{us:.2f},{tflops:.1f}\n")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, 11008, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(11008, device=dev, dtype=torch.bfloat16)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        record_shapes=True,
    ) as prof:
        for _ in range(3):
            torch.mm(a, b)
            torch.addmm(bias, a, w)
        torch.cuda.synchronize()
    prof.export_chrome_trace(sys.argv[2])


main()
