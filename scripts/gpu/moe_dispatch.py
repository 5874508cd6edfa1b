"""Measures what a mixture-of-experts layer's token dispatch costs beside its GEMMs, on the GPU it
runs on, with PyTorch:

1. The permutation passes as Megatron-Core's allgather token dispatcher wrote them (2024): an
   element-wise `torch.gather` and `scatter_add` on an index expanded over the hidden dimension
   (`index.view(-1, 1).expand(-1, h)`), against the row-wise `index_select` / `index_add_` that
   move the same rows and a plain copy of the same bytes.
2. A sequential expert loop (one small MLP per local expert, SwiGLU, forward and backward under
   autograd, as Megatron-Core's SequentialMLP runs it): the wall time per expert with a handful
   of tokens (the host's time to issue one expert's work) and with the tokens routing gives.

3. The memory-bound passes of a Llama layer as eager PyTorch writes them (torchtitan's RMSNorm
   in float32, `F.rms_norm`, SwiGLU, the residual add), forward and forward+backward, to set
   beside the bytes the cost model counts for them.

Writes dispatch.csv, expert_loop.csv and elementwise.csv into OUT_DIR (the sections named, or
all). Each figure is the median of 20 timed calls after 5 warm-ups.

Usage: python3 scripts/gpu/moe_dispatch.py OUT_DIR [dispatch] [expert_loop] [elementwise]"""

import sys
import time

import torch
import torch.nn.functional as F

from primitives import REPS, WARMUP, gpu_label, median_ms, write_benches


def median_wall_ms(fn):
    """`median_ms` timed on the host's clock, so that the host's own time counts."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def bench_dispatch(writer):
    dev, dt = "cuda", torch.bfloat16
    for tokens in (4096, 8192, 16384):
        for top_k in (1, 2, 3, 8):
            for h in (4096, 7168):
                rows = tokens * top_k
                src = torch.randn(tokens, h, device=dev, dtype=dt)
                moved = torch.randn(rows, h, device=dev, dtype=dt)
                # Megatron's first gather repeats each token top_k times in order; its second
                # follows the argsort of the expert choices, a permutation.
                repeated = torch.arange(tokens, device=dev).repeat_interleave(top_k)
                permutation = torch.randperm(rows, device=dev) % tokens
                out = torch.zeros(tokens, h, device=dev, dtype=dt)
                for order, index in (("repeated", repeated), ("permuted", permutation)):
                    expanded = index.view(-1, 1).expand(-1, h)
                    cases = {
                        "gather_expanded": lambda: torch.gather(src, 0, expanded),
                        "scatter_add_expanded": lambda: out.scatter_add_(0, expanded, moved),
                        "index_select": lambda: src.index_select(0, index),
                        "index_add": lambda: out.index_add_(0, index, moved),
                        "copy": lambda: moved.clone(),
                    }
                    for op, fn in cases.items():
                        if op == "copy" and order == "permuted":
                            continue
                        ms = median_ms(fn)
                        writer.writerow([gpu_label(), op, order, tokens, top_k, h, "bf16",
                                         rows * h, f"{ms * 1e3:.1f}",
                                         f"{rows * h * 2 * 2 / (ms * 1e-3) / 1e9:.1f}"])
                del src, moved, out


def bench_expert_loop(writer):
    dev, dt = "cuda", torch.bfloat16
    h, ffn = 4096, 1792  # a 14,336-wide expert split over 8 tensor-parallel ranks
    for experts in (8, 32):
        fc1 = [(torch.randn(2 * ffn, h, device=dev, dtype=dt) * 0.02).requires_grad_()
               for _ in range(experts)]
        fc2 = [(torch.randn(h, ffn, device=dev, dtype=dt) * 0.02).requires_grad_()
               for _ in range(experts)]
        for per_expert in (8, 768):
            x = torch.randn(experts * per_expert, h, device=dev, dtype=dt, requires_grad=True)
            split = [per_expert] * experts

            def step():
                outs = []
                for chunk, w1, w2 in zip(torch.split(x, split), fc1, fc2):
                    a, b = F.linear(chunk, w1).chunk(2, dim=-1)
                    outs.append(F.linear(F.silu(a) * b, w2))
                torch.cat(outs).sum().backward()

            def forward():
                outs = []
                for chunk, w1, w2 in zip(torch.split(x, split), fc1, fc2):
                    a, b = F.linear(chunk, w1).chunk(2, dim=-1)
                    outs.append(F.linear(F.silu(a) * b, w2))
                torch.cat(outs)

            wall = median_wall_ms(step)
            gpu = median_ms(step)
            forward_wall = median_wall_ms(forward)
            flops = 3 * 2 * experts * per_expert * h * 3 * ffn
            writer.writerow([gpu_label(), experts, per_expert, h, ffn, f"{wall * 1e3:.1f}",
                             f"{gpu * 1e3:.1f}", f"{wall * 1e3 / experts:.1f}",
                             f"{forward_wall * 1e3 / experts:.1f}",
                             f"{flops / (wall * 1e-3) / 1e12:.1f}"])


def bench_elementwise(writer):
    dev, dt = "cuda", torch.bfloat16
    eps = 1e-6
    for tokens, h in ((8192, 4096), (16384, 8192)):
        weight = torch.ones(h, device=dev, dtype=dt, requires_grad=True)

        def rmsnorm_fp32(x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight

        cases = {
            "rmsnorm_eager_fp32": (1, lambda x: rmsnorm_fp32(x[0])),
            "rms_norm_functional": (1, lambda x: F.rms_norm(x[0], (h,), weight, eps)),
            "swiglu": (2, lambda x: F.silu(x[0]) * x[1]),
            "residual_add": (2, lambda x: x[0] + x[1]),
        }
        for op, (inputs, fn) in cases.items():
            xs = [torch.randn(tokens, h, device=dev, dtype=dt, requires_grad=True)
                  for _ in range(inputs)]
            grad = torch.randn(tokens, h, device=dev, dtype=dt)
            forward = median_ms(lambda: fn(xs))
            both = median_ms(lambda: fn(xs).backward(grad))
            writer.writerow([gpu_label(), op, tokens, h, "bf16", f"{forward * 1e3:.1f}",
                             f"{both * 1e3:.1f}"])


SECTIONS = {
    "dispatch": ("dispatch.csv", "gpu,op,index_order,tokens,top_k,hidden,dtype,elements,time_us,"
                 "gb_per_s_two_bytes_read_and_written", bench_dispatch),
    "expert_loop": ("expert_loop.csv", "gpu,experts,tokens_per_expert,hidden,ffn_per_rank,"
                    "wall_us_forward_backward,gpu_events_us,wall_us_per_expert,"
                    "forward_wall_us_per_expert,tflops_wall", bench_expert_loop),
    "elementwise": ("elementwise.csv", "gpu,op,tokens,hidden,dtype,forward_us,forward_backward_us",
                    bench_elementwise),
}


def main():
    write_benches(sys.argv[1], sys.argv[2:] or list(SECTIONS), SECTIONS)


if __name__ == "__main__":
    main()
