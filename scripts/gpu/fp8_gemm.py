"""Measures what FP8 training costs on the GPU it runs on, with PyTorch's own FP8 GEMM
(`torch._scaled_mm`, cuBLASLt for tensor-wise scales, CUTLASS for row-wise ones):

- gemm.csv: the same GEMM in bf16 (`torch.matmul`), FP8 with one scale per tensor and FP8 with
  one scale per row of A and per column of B (torchao's and torchtitan's "rowwise" recipe),
  at the shapes of a Llama 3 8B and 70B layer (forward, input-gradient and weight-gradient
  GEMMs) at torchtitan's published tensor-parallel degree and tokens, and square sizes;
- casts.csv: the cast of a bf16 tensor to FP8 with its scale (amax, scale, saturate, cast),
  tensor-wise, row-wise and column-wise (a transposed copy, as the backward's operands need),
  eager and under torch.compile (torchtitan compiles its float8 casts);
- linear.csv: one linear layer's forward and backward (three GEMMs with every cast they need)
  in bf16, FP8 tensor-wise and FP8 row-wise, casts compiled;
- sustained.csv: each recipe's 8192^3 product back to back for 15 s, a rate per second.

Usage: python3 scripts/gpu/fp8_gemm.py OUT_DIR [gemm] [casts] [linear] [sustained]
Each figure is the median of 20 calls timed one by one with CUDA events after 5 warm-ups."""

import sys

import torch

from primitives import gpu_label, median_ms, write_benches

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max


def source():
    return (f"measured by this project with scripts/gpu/fp8_gemm.py on a lent machine, "
            f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}")


# (name, hidden, kv heads x head width, ffn, tensor-parallel degree, tokens per GEMM): torchtitan's
# asyncTP benchmark runs Llama 3 8B at tp 8 with local batch 12 and 70B at tp 8 with local batch
# 16, 8,192 tokens each (sequence parallel: a GEMM sees the micro-batch's tokens whole).
LAYERS = [
    ("llama3-8b tp8", 4096, 1024, 14336, 8, 12 * 8192),
    ("llama3-70b tp8", 8192, 1024, 28672, 8, 16 * 8192),
    ("llama3-8b tp1", 4096, 1024, 14336, 1, 8192),
    ("llama3-70b tp1", 8192, 1024, 28672, 1, 8192),
]


def layer_gemms():
    """(m, n, k, what) of each linear layer's forward, input-gradient and weight-gradient GEMM."""
    shapes = []
    for name, h, kv, ffn, tp, m in LAYERS:
        for linear, n, k in (("qkv", (h + 2 * kv) // tp, h), ("attention out", h, h // tp),
                             ("w1 and w3 each", ffn // tp, h), ("w2", h, ffn // tp)):
            shapes.append((m, n, k, f"{name} {linear} forward"))
            shapes.append((m, k, n, f"{name} {linear} input gradient"))
            shapes.append((n, k, m, f"{name} {linear} weight gradient"))
    for s in (2048, 4096, 8192, 16384):
        shapes.append((s, s, s, "square"))
    return shapes


def fp8_operands(m, n, k):
    a = torch.randn(m, k, device="cuda").to(E4M3)
    b = torch.randn(n, k, device="cuda").to(E4M3).t()  # column-major K x N, as cuBLASLt needs
    return a, b


def bench_gemm(writer):
    label, src = gpu_label(), source()
    for m, n, k, what in layer_gemms():
        flops = 2 * m * n * k
        a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b16 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: torch.matmul(a16, b16))
        writer.writerow([label, "bf16", m, n, k, f"{flops / (ms * 1e-3) / 1e12:.1f}", f"{ms * 1e3:.1f}",
                         "cuBLAS via torch.matmul", src, "fp8 sweep", f"{what}; random N(0,1) inputs"])
        del a16, b16
        a, b = fp8_operands(m, n, k)
        one = torch.ones((), device="cuda")
        rows, cols = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
        for dtype, sa, sb, library in (("fp8 (tensorwise)", one, one, "cuBLASLt via torch._scaled_mm"),
                                       ("fp8 (rowwise)", rows, cols, "torch._scaled_mm, row-wise scales")):
            try:
                ms = median_ms(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
            except RuntimeError as e:
                print(f"{dtype} {m}x{n}x{k}: {e}", flush=True)
                continue
            writer.writerow([label, dtype, m, n, k, f"{flops / (ms * 1e-3) / 1e12:.1f}", f"{ms * 1e3:.1f}",
                             library, src, "fp8 sweep", f"{what}; e4m3 x e4m3 to bf16, random N(0,1) inputs"])
        del a, b


def scaled_cast(x, amax):
    """x in e4m3 with the scale that maps `amax` to e4m3's largest value, and that scale's
    inverse, which the GEMM multiplies back."""
    scale = E4M3_MAX / amax.float().clamp(min=1e-12)
    return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale.reciprocal()


def tensorwise_cast(x):
    return scaled_cast(x, x.abs().amax())


def rowwise_cast(x):
    return scaled_cast(x, x.abs().amax(dim=1, keepdim=True))


def colwise_cast(x):
    # The backward's operands are scaled along the other axis and laid out transposed.
    y, inverse = scaled_cast(x, x.abs().amax(dim=0, keepdim=True))
    return y.t().contiguous(), inverse


CASTS = {"tensorwise": tensorwise_cast, "rowwise": rowwise_cast, "columnwise transposed": colwise_cast}


def bench_casts(writer):
    label, src = gpu_label(), source()
    compiled = {name: torch.compile(fn) for name, fn in CASTS.items()}
    for rows, cols in ((98304, 4096), (98304, 1792), (131072, 8192), (8192, 14336)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        for name in CASTS:
            for mode, fn in (("eager", CASTS[name]), ("torch.compile", compiled[name])):
                ms = median_ms(lambda: fn(x))
                # Bytes a single fused pass would move: read 2, write 1 per element.
                gbps = 3 * rows * cols / (ms * 1e-3) / 1e9
                writer.writerow([label, name, mode, rows, cols, f"{ms * 1e3:.1f}", f"{gbps:.0f}", src,
                                 "bf16 to e4m3 with amax and scale; GB/s counts 3 bytes per element"])
        del x


def linear_step(kind, x, w, grad):
    """A linear layer's forward and backward as each recipe runs it; returns the three outputs."""
    if kind == "bf16":
        return x @ w.t(), grad @ w, grad.t() @ x
    cast = compiled_casts()[kind]
    ones_kind = kind == "tensorwise"
    xq, xs = cast["row"](x)
    wq, ws = cast["row"](w)
    y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws if ones_kind else ws.t(), out_dtype=torch.bfloat16)
    gq, gs = cast["row"](grad)
    wtq, wts = cast["col"](w)          # W^T laid out N-major, scaled per column of W
    dx = torch._scaled_mm(gq, wtq.t(), scale_a=gs, scale_b=wts, out_dtype=torch.bfloat16)
    gtq, gts = cast["col"](grad)       # grad^T, scaled along tokens
    xtq, xts = cast["col"](x)
    dw = torch._scaled_mm(gtq, xtq.t(), scale_a=gts if ones_kind else gts.t(),
                          scale_b=xts, out_dtype=torch.bfloat16)
    return y, dx, dw


_COMPILED = {}


def compiled_casts():
    if not _COMPILED:
        _COMPILED["tensorwise"] = {"row": torch.compile(tensorwise_cast),
                                   "col": torch.compile(lambda x: (lambda q, s: (q.t().contiguous(), s))(
                                       *tensorwise_cast(x)))}
        _COMPILED["rowwise"] = {"row": torch.compile(rowwise_cast), "col": torch.compile(colwise_cast)}
    return _COMPILED


def bench_linear(writer):
    label, src = gpu_label(), source()
    for name, h, _, ffn, tp, m in LAYERS[:2]:
        n, k = ffn // tp, h
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 6 * m * n * k
        for kind in ("bf16", "tensorwise", "rowwise"):
            try:
                ms = median_ms(lambda: linear_step(kind, x, w, grad))
            except RuntimeError as e:
                print(f"linear {kind}: {e}", flush=True)
                continue
            writer.writerow([label, kind, m, n, k, f"{ms * 1e3:.1f}", f"{flops / (ms * 1e-3) / 1e12:.1f}", src,
                             f"{name} w1: forward, input and weight gradient with every cast (compiled)"])
        del x, w, grad


def bench_sustained(writer):
    """Each recipe's 8192^3 product back to back for 15 s (the GPU at its power cap): the rate
    of each second, so that the FP8-to-bf16 ratio under sustained load can be read."""
    label, src = gpu_label(), source()
    n = 8192
    a16 = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a, b = fp8_operands(n, n, n)
    one = torch.ones((), device="cuda")
    rows, cols = torch.ones(n, 1, device="cuda"), torch.ones(1, n, device="cuda")
    runs = (("bf16", lambda: torch.matmul(a16, b16)),
            ("fp8 (tensorwise)", lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
            ("fp8 (rowwise)", lambda: torch._scaled_mm(a, b, scale_a=rows, scale_b=cols, out_dtype=torch.bfloat16)))
    for dtype, fn in runs:
        for second in range(15):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            calls = 0
            start.record()
            while True:
                for _ in range(16):
                    fn()
                calls += 16
                end.record()
                end.synchronize()
                if start.elapsed_time(end) > 1000.0:
                    break
            ms = start.elapsed_time(end)
            writer.writerow([label, dtype, n, second, calls, f"{2 * n**3 * calls / (ms * 1e-3) / 1e12:.1f}", src])


BENCHES = {
    "gemm": ("gemm.csv", "gpu,dtype,m,n,k,tflops,time_us,library,source,table,notes", bench_gemm),
    "casts": ("casts.csv", "gpu,cast,mode,rows,cols,time_us,gbps,source,notes", bench_casts),
    "sustained": ("sustained.csv", "gpu,dtype,n,second,calls,tflops,source", bench_sustained),
    "linear": ("linear.csv", "gpu,recipe,m,n,k,time_us,tflops,source,notes", bench_linear),
}


def main():
    chosen = sys.argv[2:] or ["gemm", "sustained", "linear", "casts"]
    write_benches(sys.argv[1], chosen, BENCHES, keep_going=True)


if __name__ == "__main__":
    main()
