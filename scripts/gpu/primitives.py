"""Measures the cost model's primitives on the GPU it runs on, with PyTorch: bf16 GEMMs of the
shapes a transformer layer runs (and a sweep across sizes), the attention kernel forward and
forward+backward (PyTorch's flash backend), and HBM copy bandwidth. Writes three CSV files in
the columns of data/microbench/ so that the rows can sit beside the published ones.

Usage: python3 scripts/gpu/primitives.py OUT_DIR [gemm] [attention] [cudnn] [memory]
(all but `cudnn` when none is named; `cudnn` writes attention.csv with SDPA's cuDNN backend)
Each figure is the median of 20 timed calls after 5 warm-ups, timed with CUDA events."""

import csv
import os
import sys
import time

import torch
import torch.nn.functional as F

REPS, WARMUP = 20, 5


def timed_calls(fn, warmups, reps):
    """The median of `reps` calls of `fn` timed one by one with CUDA events, in ms, after
    `warmups` untimed calls (the first compiles what is compiled), and the warm-ups' wall
    seconds."""
    began = time.time()
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    warm_s = time.time() - began
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], warm_s


def median_ms(fn):
    return timed_calls(fn, WARMUP, REPS)[0]


def gpu_label():
    p = torch.cuda.get_device_properties(0)
    return f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB)"


def source():
    return (f"measured by this project with scripts/gpu/primitives.py on a lent machine, "
            f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}")


def gemm_shapes():
    # A transformer layer's four GEMMs (tokens m = micro-batch x sequence / tp) for common
    # hidden sizes and tensor-parallel splits, then square sizes for the roofline's knee.
    shapes = set()
    for h, ffn in [(2048, 8192), (4096, 14336), (5120, 13824), (8192, 28672), (12288, 49152), (16384, 53248)]:
        for tp in (1, 2, 4, 8):
            for m in (2048, 4096, 8192, 16384):
                shapes.add((m, 3 * h // tp, h))       # qkv
                shapes.add((m, h, h // tp))           # attention output
                shapes.add((m, ffn // tp, h))         # mlp up
                shapes.add((m, h, ffn // tp))         # mlp down
    for s in (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384):
        shapes.add((s, s, s))
    for m in (16, 64, 128, 256, 512, 1024):           # few tokens: decoding, small experts
        shapes.add((m, 4096, 4096))
        shapes.add((m, 14336, 4096))
    return sorted(shapes)


def bench_gemm(writer):
    label, src = gpu_label(), source()
    for m, n, k in gemm_shapes():
        if m * k + k * n + m * n > 3 * 2**30:
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: torch.matmul(a, b))
        tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
        writer.writerow([label, "bf16", m, n, k, f"{tflops:.1f}", f"{ms * 1e3:.1f}",
                         "cuBLAS via torch.matmul", src, "gemm sweep", "random N(0,1) inputs"])
        del a, b


ATTENTION_BACKENDS = {
    "flash": ("FLASH_ATTENTION", "FlashAttention-2", "PyTorch SDPA flash backend (FlashAttention-2 kernels)"),
    "cudnn": ("CUDNN_ATTENTION", "cuDNN", "PyTorch SDPA cuDNN backend (cuDNN's fused flash attention, Transformer Engine's kernel on Hopper)"),
}


def bench_attention(writer, backend="flash"):
    label, src = gpu_label(), source()
    sdpa_backend, kernel, note = ATTENTION_BACKENDS[backend]
    sdpa_backend = getattr(torch.nn.attention.SDPBackend, sdpa_backend)
    for head_dim in (64, 128):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            heads = 2048 // head_dim if head_dim == 64 else 16
            for heads in (heads, 32 if head_dim == 128 else 64):
                batch = max(1, 16384 // seq)
                for causal in (False, True):
                    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda",
                                           dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
                    with torch.nn.attention.sdpa_kernel(sdpa_backend):
                        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        grad = torch.randn_like(out)

                        def both():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            o.backward(grad)
                        fb = median_ms(both)
                    flops = 4 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
                    for direction, ms, f in (("fwd", fwd, flops), ("fwd_bwd", fb, 3.5 * flops)):
                        writer.writerow([label, "bf16", kernel, batch, seq, heads,
                                         head_dim, "yes" if causal else "no", direction,
                                         f"{f / (ms * 1e-3) / 1e12:.1f}", f"{ms * 1e3:.1f}", src,
                                         "attention sweep",
                                         f"{note}; FLOPs counted as flash-attention's benchmark does: 4·b·h·s²·d forward, "
                                         "halved when causal; forward+backward 3.5x forward"])
                    del q, k, v, out, grad


def bench_memory(writer):
    label, src = gpu_label(), source()
    for mib in (1, 4, 16, 64, 256, 1024, 4096):
        n = mib * 2**20
        x = torch.empty(n, device="cuda", dtype=torch.uint8)
        y = torch.empty_like(x)
        ms = median_ms(lambda: y.copy_(x))
        writer.writerow([label, "hbm_copy", n, f"{2 * n / (ms * 1e-3) / 1e9:.0f}", src, "copy sweep",
                         "device-to-device copy_; bytes read plus written"])
        del x, y
    for mib in (64, 1024):
        n = mib * 2**20
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        d = torch.empty(n, device="cuda", dtype=torch.uint8)
        ms = median_ms(lambda: d.copy_(h, non_blocking=True))
        writer.writerow([label, "host_to_device", n, f"{n / (ms * 1e-3) / 1e9:.1f}", src, "copy sweep",
                         "pinned host to device"])
        ms = median_ms(lambda: h.copy_(d, non_blocking=True))
        writer.writerow([label, "device_to_host", n, f"{n / (ms * 1e-3) / 1e9:.1f}", src, "copy sweep",
                         "device to pinned host"])


ATTENTION_HEADER = "gpu,dtype,kernel,batch,seq_len,heads,head_dim,causal,direction,tflops,time_us,source,table,notes"
BENCHES = {
    "gemm": ("gemm.csv", "gpu,dtype,m,n,k,tflops,time_us,library,source,table,notes", bench_gemm),
    "attention": ("attention.csv", ATTENTION_HEADER, bench_attention),
    "cudnn": ("attention.csv", ATTENTION_HEADER, lambda writer: bench_attention(writer, "cudnn")),
    "memory": ("memory.csv", "gpu,test,bytes,gbps,source,table,notes", bench_memory),
}


def write_benches(out, chosen, benches, keep_going=False):
    """Runs each chosen bench into its CSV file under `out`; `benches` maps a choice to (file
    name, comma-separated header, bench(writer)). With `keep_going`, a bench that fails on this
    machine is reported and the files of the others are still written."""
    os.makedirs(out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    for choice in chosen:
        name, header, bench = benches[choice]
        with open(os.path.join(out, name), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header.split(","))
            try:
                bench(writer)
            except Exception as e:
                if not keep_going:
                    raise
                print(f"{choice} failed: {type(e).__name__}: {e}", flush=True)
        print(f"wrote {name}", flush=True)


def main():
    write_benches(sys.argv[1], sys.argv[2:] or ["gemm", "attention", "memory"], BENCHES)


if __name__ == "__main__":
    main()
