"""Times what an eager PyTorch transformer block runs besides its GEMMs and attention, as
torchtitan's Llama wrote it in 2024 (the code of its published A100 and H100 eager runs):
RMSNorm as a composite of float32 operators, rotary embeddings as a complex multiplication in
float32, grouped key/value heads repeated by expand and reshape (a copy), the attention output
transposed and made contiguous. Each is timed alone, forward and forward+backward, beside the
fused alternatives (`F.rms_norm`, a bf16 rotate-half RoPE); then the whole block, eager and
under `torch.compile`, forward+backward, with a profile of the eager block's kernels by kind.

Writes ops.csv, block.csv and block_kernels.csv into OUT_DIR (the sections named, or both).
Each figure is the median of 20 timed calls after 5 warm-ups (blocks: 10 after 3), timed with
CUDA events.

Usage: python3 scripts/gpu/eager_layer.py OUT_DIR [ops] [block]"""

import csv
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from primitives import gpu_label, median_ms, timed_calls

HEAD_DIM = 128
EPS = 1e-5


class CompositeRMSNorm(nn.Module):
    """RMSNorm in float32 operators, as torchtitan's `norm_type = "rmsnorm"` (2024) and Hugging
    Face's LlamaRMSNorm write it."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x) * self.weight


def rope_complex(xq, xk, freqs_cis):
    """Rotary embeddings as torchtitan's 2024 `apply_rotary_emb`: float32 complex products."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return (torch.view_as_real(xq_ * f).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * f).flatten(3).type_as(xk))


def rope_half(xq, xk, cos, sin):
    """Rotary embeddings in bf16 by rotating halves (one pass per tensor when fused)."""
    def rotate(t):
        a, b = t[..., : HEAD_DIM // 2], t[..., HEAD_DIM // 2:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return rotate(xq), rotate(xk)


def repeat_kv(x, n_rep):
    bs, slen, heads, dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, heads, n_rep, dim).reshape(bs, slen, heads * n_rep, dim)


def angles(seq):
    freqs = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    return torch.outer(torch.arange(seq, device="cuda").float(), freqs)


def timed(fn, inputs):
    """Forward alone, then forward and backward, in microseconds."""
    forward = median_ms(lambda: fn(*inputs))
    out = fn(*inputs)
    grads = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]

    def both():
        o = fn(*inputs)
        torch.autograd.backward(o if isinstance(o, tuple) else (o,), grads)
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.grad is not None:
                t.grad = None
    return forward * 1e3, median_ms(both) * 1e3


def bench_ops(writer):
    dev, dt = "cuda", torch.bfloat16
    # (tokens, hidden, kv heads): Llama 3 8B and 70B widths with 8 key/value heads, Llama 2 13B's
    # 40 heads with no grouping.
    for tokens, h, kv in ((8192, 4096, 8), (8192, 5120, 40), (8192, 8192, 8), (16384, 4096, 8)):
        heads = h // HEAD_DIM
        seq = 4096 if tokens % 4096 == 0 else tokens
        batch = tokens // seq
        x = torch.randn(tokens, h, device=dev, dtype=dt, requires_grad=True)
        composite = CompositeRMSNorm(h).to(dev, dt)
        weight = torch.ones(h, device=dev, dtype=dt, requires_grad=True)
        xq = torch.randn(batch, seq, heads, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
        xk = torch.randn(batch, seq, kv, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
        ang = angles(seq)
        freqs_cis = torch.polar(torch.ones_like(ang), ang)
        cos = ang.cos().to(dt)[None, :, None, :]
        sin = ang.sin().to(dt)[None, :, None, :]
        attn_out = torch.randn(batch, heads, seq, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
        cases = [
            ("rmsnorm_composite_fp32", tokens * h, lambda t: composite(t), (x,)),
            ("rms_norm_functional", tokens * h, lambda t: F.rms_norm(t, (h,), weight, EPS), (x,)),
            ("rope_complex_fp32", tokens * (heads + kv) * HEAD_DIM,
             lambda q, k: rope_complex(q, k, freqs_cis), (xq, xk)),
            ("rope_rotate_half_bf16", tokens * (heads + kv) * HEAD_DIM,
             lambda q, k: rope_half(q, k, cos, sin), (xq, xk)),
            ("repeat_kv", tokens * heads * HEAD_DIM * (0 if kv == heads else 1),
             lambda k: repeat_kv(k, heads // kv), (xk,)),
            ("transpose_contiguous", tokens * h,
             lambda o: o.transpose(1, 2).contiguous(), (attn_out,)),
        ]
        for op, elements, fn, inputs in cases:
            if elements == 0:
                continue
            try:
                forward, both = timed(fn, inputs)
            except Exception as e:  # keep the other rows
                print(f"{op} {tokens}x{h}: {type(e).__name__}: {e}", flush=True)
                continue
            writer.writerow([gpu_label(), op, tokens, h, heads, kv, elements, "bf16",
                             f"{forward:.1f}", f"{both:.1f}"])
            print(f"{op:24} tokens {tokens} h {h} kv {kv}: {forward:.1f} / {both:.1f} us", flush=True)
        del x, xq, xk, attn_out
        torch.cuda.empty_cache()


class Block(nn.Module):
    """torchtitan's 2024 Llama block: composite RMSNorm (or `nn.RMSNorm`), wq/wk/wv/wo, complex
    RoPE, repeated key/value heads, causal SDPA, SwiGLU."""

    def __init__(self, h, heads, kv, ffn, fused_norm):
        super().__init__()
        self.heads, self.kv = heads, kv
        norm = (lambda: nn.RMSNorm(h, eps=EPS)) if fused_norm else (lambda: CompositeRMSNorm(h))
        self.attention_norm, self.ffn_norm = norm(), norm()
        self.wq = nn.Linear(h, heads * HEAD_DIM, bias=False)
        self.wk = nn.Linear(h, kv * HEAD_DIM, bias=False)
        self.wv = nn.Linear(h, kv * HEAD_DIM, bias=False)
        self.wo = nn.Linear(heads * HEAD_DIM, h, bias=False)
        self.w1 = nn.Linear(h, ffn, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)

    def attention(self, x, freqs_cis):
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, HEAD_DIM)
        k = self.wk(x).view(bs, seq, -1, HEAD_DIM)
        v = self.wv(x).view(bs, seq, -1, HEAD_DIM)
        q, k = rope_complex(q, k, freqs_cis)
        k, v = repeat_kv(k, self.heads // self.kv), repeat_kv(v, self.heads // self.kv)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(bs, seq, -1))

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        n = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


KINDS = (("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "sm80_xmma", "ampere_", "aten::mm")),
         ("attention", ("flash", "fmha", "cudnn", "attention")),
         ("copy", ("copy", "Memcpy", "cat")),
         ("reduce", ("reduce",)),
         ("elementwise", ("elementwise", "vectorized", "unrolled", "triton")))


def kind_of(name):
    lower = name.lower()
    for kind, keys in KINDS:
        if any(k.lower() in lower for k in keys):
            return kind
    return "other"


def block_kernels(step, passes=3):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            step()
        torch.cuda.synchronize()
    return [(e.key, e.count / passes, e.self_device_time_total / passes)
            for e in prof.key_averages() if e.self_device_time_total > 0]


def bench_blocks(block_writer, kernel_writer):
    # (name, hidden, heads, kv heads, ffn, sequences, sequence length): torchtitan's A100 runs
    # (Llama 3 8B at local batch 1, Llama 2 13B at 2) and its 8B H100 run (local batch 2).
    models = [("llama3-8b", 4096, 32, 8, 14336, 1, 8192),
              ("llama2-13b", 5120, 40, 40, 13824, 2, 4096),
              ("llama3-8b mb2", 4096, 32, 8, 14336, 2, 8192)]
    for name, h, heads, kv, ffn, batch, seq in models:
        for variant in ("eager", "eager fused norm", "compiled"):
            torch.manual_seed(0)
            block = Block(h, heads, kv, ffn, fused_norm=variant == "eager fused norm")
            block = block.cuda().to(torch.bfloat16)
            run = torch.compile(block) if variant == "compiled" else block
            x = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            ang = angles(seq)
            freqs_cis = torch.polar(torch.ones_like(ang), ang)
            grad = torch.randn_like(x)

            def step():
                run(x, freqs_cis).backward(grad)
                x.grad = None
                for p in block.parameters():
                    p.grad = None
            try:
                ms, warm = timed_calls(step, 3, 10)
                kernels = block_kernels(step) if variant != "compiled" or name == "llama3-8b" else []
            except Exception as e:
                print(f"{name} {variant}: {type(e).__name__}: {e}", flush=True)
                continue
            by_kind = {}
            for key, calls, us in kernels:
                by_kind[kind_of(key)] = by_kind.get(kind_of(key), 0.0) + us
                kernel_writer.writerow([name, variant, key[:160], f"{calls:g}", f"{us:.1f}", kind_of(key)])
            block_writer.writerow([gpu_label(), name, variant, h, heads, kv, ffn, batch, seq, f"{ms * 1e3:.0f}",
                                   f"{warm:.0f}"] + [f"{by_kind.get(k, 0.0):.0f}" for k, _ in KINDS] +
                                  [f"{by_kind.get('other', 0.0):.0f}"])
            print(f"{name:14} {variant:17} {ms:8.2f} ms  " +
                  " ".join(f"{k} {by_kind.get(k, 0.0) / 1e3:.2f}" for k, _ in KINDS), flush=True)
            del block, run, x, grad
            torch._dynamo.reset()
            torch.cuda.empty_cache()


def main():
    out, sections = sys.argv[1], sys.argv[2:] or ["ops", "block"]
    os.makedirs(out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    if "ops" in sections:
        with open(f"{out}/ops.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["gpu", "op", "tokens", "hidden", "heads", "kv_heads", "elements", "dtype",
                        "forward_us", "forward_backward_us"])
            bench_ops(w)
    if "block" in sections:
        with open(f"{out}/block.csv", "w", newline="") as f, \
                open(f"{out}/block_kernels.csv", "w", newline="") as k:
            w = csv.writer(f)
            w.writerow(["gpu", "model", "variant", "hidden", "heads", "kv_heads", "ffn", "sequences",
                        "seq_len", "forward_backward_us", "warmup_s"] +
                       [f"{kind}_us" for kind, _ in KINDS] + ["other_us"])
            kw = csv.writer(k)
            kw.writerow(["model", "variant", "kernel", "calls_per_pass", "us_per_pass", "kind"])
            bench_blocks(w, kw)


if __name__ == "__main__":
    main()
