// Element-wise activations and arithmetic on row-major f32 buffers, one thread per element.
// The formulas are the CPU backend's (tanh GELU, SiLU, SwiGLU = silu(gate) * up).

#define GELU_C 0.7978845608028654f

__device__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

extern "C" __global__ void gelu_forward(const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(GELU_C * (v + 0.044715f * v * v * v)));
}

extern "C" __global__ void gelu_backward(const float* x, const float* dy, float* dx, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float t = tanhf(GELU_C * (v + 0.044715f * v * v * v));
    float dt = GELU_C * (1.0f + 3.0f * 0.044715f * v * v) * (1.0f - t * t);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
}

extern "C" __global__ void silu_forward(const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = x[i] * sigmoid_f(x[i]);
}

extern "C" __global__ void silu_backward(const float* x, const float* dy, float* dx, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = sigmoid_f(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
}

// out = silu(gate) * up
extern "C" __global__ void swiglu_forward(const float* gate, const float* up, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = gate[i] * sigmoid_f(gate[i]) * up[i];
}

extern "C" __global__ void swiglu_backward(const float* gate, const float* up, const float* dout,
                                           float* dgate, float* dup, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    float s = sigmoid_f(g);
    dup[i] = dout[i] * g * s;
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
}

extern "C" __global__ void add(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] + b[i];
}

extern "C" __global__ void mul(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] * b[i];
}

// out[r][c] = a[r][c] + bias[c]
extern "C" __global__ void add_row(const float* a, const float* bias, float* out,
                                   unsigned int rows, unsigned int cols) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    out[i] = a[i] + bias[i % cols];
}

// out[c] = sum over rows, in row order (deterministic).
extern "C" __global__ void sum_rows(const float* a, float* out, unsigned int rows, unsigned int cols) {
    unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) s += a[r * cols + c];
    out[c] = s;
}
