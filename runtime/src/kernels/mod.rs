//! CUDA C sources of the custom kernels, compiled at run time with NVRTC by the `cuda` backend.
//! They are plain strings so that they build (and are compiled to PTX in CI) without a GPU or
//! the `cuda` feature. Each kernel mirrors the CPU backend's formula and indexing.

/// One CUDA source file and the `extern "C"` kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// Module name, used as the NVRTC program name.
    pub name: &'static str,
    pub source: &'static str,
    pub entry_points: &'static [&'static str],
}

/// The architecture the kernels are compiled for when no device says otherwise (Ampere).
pub const DEFAULT_ARCH: &str = "sm_80";

/// Threads per block of element-wise launches.
pub const BLOCK: u32 = 256;

/// Threads per block of row-wise launches (one block per row; a power of two).
pub const ROW_BLOCK: u32 = 256;

pub const ELEMENTWISE: KernelSource = KernelSource {
    name: "elementwise",
    source: include_str!("elementwise.cu"),
    entry_points: &[
        "gelu_forward",
        "gelu_backward",
        "silu_forward",
        "silu_backward",
        "swiglu_forward",
        "swiglu_backward",
        "add",
        "mul",
        "add_row",
        "sum_rows",
    ],
};

pub const NORM: KernelSource = KernelSource {
    name: "norm",
    source: include_str!("norm.cu"),
    entry_points: &[
        "norm_forward",
        "norm_backward_input",
        "norm_backward_params",
    ],
};

pub const SOFTMAX: KernelSource = KernelSource {
    name: "softmax",
    source: include_str!("softmax.cu"),
    entry_points: &["causal_softmax", "causal_softmax_backward"],
};

pub const CROSS_ENTROPY: KernelSource = KernelSource {
    name: "cross_entropy",
    source: include_str!("cross_entropy.cu"),
    entry_points: &["cross_entropy"],
};

pub const EMBEDDING: KernelSource = KernelSource {
    name: "embedding",
    source: include_str!("embedding.cu"),
    entry_points: &["gather_rows", "scatter_add_rows"],
};

pub const ADAM: KernelSource = KernelSource {
    name: "adam",
    source: include_str!("adam.cu"),
    entry_points: &["adam_step"],
};

pub const ROPE: KernelSource = KernelSource {
    name: "rope",
    source: include_str!("rope.cu"),
    entry_points: &["rope"],
};

/// Every kernel source, in a fixed order.
pub const ALL: [KernelSource; 7] = [
    ELEMENTWISE,
    NORM,
    SOFTMAX,
    CROSS_ENTROPY,
    EMBEDDING,
    ADAM,
    ROPE,
];

/// Blocks needed to cover `n` elements with `BLOCK` threads each.
pub fn grid_for(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).max(1) as u32
}
