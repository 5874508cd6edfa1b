"""Times one Llama 3 layer's forward and backward, compiled with torch.compile as torchtitan
compiles each transformer block, in bf16 and with torchao's float8 training recipes
(`convert_to_float8_training`, "tensorwise" and "rowwise"), at the shapes one GPU of
torchtitan's asyncTP benchmark runs: Llama 3 8B and 70B at tensor parallelism 8 (the layer's
local heads and FFN columns) with 12 and 16 sequences of 8,192 tokens (sequence parallelism
gathers the micro-batch whole before each GEMM). No communication: the layer's compute alone,
so that its float8-to-bf16 ratio can be set beside the cost model's.

Usage: python3 scripts/gpu/fp8_layer.py OUT.csv [WHEEL_DIR [KERNELS.csv]]
(torchao is installed from WHEEL_DIR when it is not importable). Each figure is the median of
10 forward+backward passes timed with CUDA events after 3 warm-ups (the first compiles). With
KERNELS.csv, three more passes run under torch.profiler and every GPU kernel's time per pass is
written there, so that GEMMs, attention and the casts can be told apart."""

import csv
import glob
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

from primitives import timed_calls

# (name, hidden, heads, kv heads, ffn, tp, sequences, sequence length)
MODELS = [
    ("llama3-8b tp8", 4096, 32, 8, 14336, 8, 12, 8192),
    ("llama3-70b tp8", 8192, 64, 8, 28672, 8, 16, 8192),
]
HEAD_DIM = 128


class Layer(nn.Module):
    """A Llama layer's local shard under tensor parallelism: torchtitan's separate wq, wk, wv,
    wo, w1, w2, w3 linears, RMSNorm, rotary embedding, causal flash attention, SwiGLU."""

    def __init__(self, hidden, heads, kv_heads, ffn, tp):
        super().__init__()
        self.heads, self.kv_heads = heads // tp, max(1, kv_heads // tp)
        self.attention_norm = nn.RMSNorm(hidden, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(hidden, eps=1e-5)
        self.wq = nn.Linear(hidden, self.heads * HEAD_DIM, bias=False)
        self.wk = nn.Linear(hidden, self.kv_heads * HEAD_DIM, bias=False)
        self.wv = nn.Linear(hidden, self.kv_heads * HEAD_DIM, bias=False)
        self.wo = nn.Linear(self.heads * HEAD_DIM, hidden, bias=False)
        self.w1 = nn.Linear(hidden, ffn // tp, bias=False)
        self.w3 = nn.Linear(hidden, ffn // tp, bias=False)
        self.w2 = nn.Linear(ffn // tp, hidden, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(batch, seq, self.heads, HEAD_DIM)
        k = self.wk(h).view(batch, seq, self.kv_heads, HEAD_DIM)
        v = self.wv(h).view(batch, seq, self.kv_heads, HEAD_DIM)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=2)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True)
        x = x + self.wo(attn.transpose(1, 2).reshape(batch, seq, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate(t, cos, sin):
    a, b = t[..., : HEAD_DIM // 2], t[..., HEAD_DIM // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).type_as(t)


def ensure_torchao(wheels):
    try:
        import torchao  # noqa: F401
    except ImportError:
        for wheel in sorted(glob.glob(f"{wheels}/torchao-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", wheel], check=False)
            try:
                import torchao  # noqa: F401
                break
            except ImportError:
                continue
    import torchao
    return torchao.__version__


def kernel_times(step, passes=3):
    """GPU time per pass of each kernel name over `passes` profiled passes."""
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(passes):
                step()
            torch.cuda.synchronize()
        return {avg.key: (avg.count / passes, avg.self_device_time_total / passes)
                for avg in prof.key_averages() if avg.self_device_time_total > 0}
    except Exception as e:  # the timing stands without the breakdown
        print(f"profiler: {type(e).__name__}: {e}", flush=True)
        return {}


def time_layer(name, hidden, heads, kv_heads, ffn, tp, sequences, seq, recipe, profiled=False):
    torch.manual_seed(0)
    layer = Layer(hidden, heads, kv_heads, ffn, tp).cuda().to(torch.bfloat16)
    for p in layer.parameters():
        nn.init.normal_(p, std=0.02)
    if recipe != "bf16":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name(recipe))
    compiled = torch.compile(layer)
    x = torch.randn(sequences, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    angles = torch.outer(torch.arange(seq, device="cuda", dtype=torch.float32),
                         1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM // 2, device="cuda") / (HEAD_DIM // 2))))
    cos = angles.cos().to(torch.bfloat16)[None, :, None, :]
    sin = angles.sin().to(torch.bfloat16)[None, :, None, :]
    grad = torch.randn_like(x)

    def step():
        compiled(x, cos, sin).backward(grad)

    median, warm_s = timed_calls(step, 3, 10)
    peak = torch.cuda.max_memory_allocated() / 2**30
    kernels = kernel_times(step) if profiled else {}
    del layer, compiled, x, grad
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return median, warm_s, peak, kernels


def main():
    out = sys.argv[1]
    torchao_version = ensure_torchao(sys.argv[2] if len(sys.argv) > 2 else ".")
    kernels_out = sys.argv[3] if len(sys.argv) > 3 else None
    kernel_rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = torch.cuda.get_device_name(0)
    source = (f"measured by this project with scripts/gpu/fp8_layer.py on a lent machine, PyTorch "
              f"{torch.__version__}, CUDA {torch.version.cuda}, torchao {torchao_version}")
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", "model", "recipe", "tokens", "time_us", "compile_and_warmup_s", "peak_gib", "source"])
        for model in MODELS:
            for recipe in ("bf16", "rowwise", "tensorwise"):
                try:
                    ms, warm_s, peak, kernels = time_layer(*model, recipe, profiled=kernels_out is not None)
                except Exception as e:  # keep the other rows when one recipe fails here
                    print(f"{model[0]} {recipe}: {type(e).__name__}: {e}", flush=True)
                    continue
                writer.writerow([gpu, model[0], recipe, model[6] * model[7], f"{ms * 1e3:.0f}", f"{warm_s:.0f}",
                                 f"{peak:.1f}", source])
                f.flush()
                print(f"{model[0]} {recipe}: {ms:.2f} ms (compile+warm-up {warm_s:.0f} s, {peak:.1f} GiB)", flush=True)
                kernel_rows += [[model[0], recipe, name, f"{calls:g}", f"{us:.1f}"]
                                for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])]
    if kernels_out:
        with open(kernels_out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["model", "recipe", "kernel", "calls_per_pass", "us_per_pass"])
            writer.writerows(kernel_rows)


if __name__ == "__main__":
    main()
