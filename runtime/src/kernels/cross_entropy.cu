// Softmax cross-entropy per row, one block per row (blockDim.x a power of two). Writes the row's
// loss (log-sum-exp minus the target logit) and scale * (softmax - onehot) as the gradient.

__device__ float ce_reduce(float v, float* shared, int is_max) {
    unsigned int t = threadIdx.x;
    shared[t] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) shared[t] = is_max ? fmaxf(shared[t], shared[t + s]) : shared[t] + shared[t + s];
        __syncthreads();
    }
    float total = shared[0];
    __syncthreads();
    return total;
}

extern "C" __global__ void cross_entropy(const float* logits, const unsigned int* targets, float* grad,
                                         float* row_loss, unsigned int cols, float scale) {
    extern __shared__ float shared[];
    size_t base = (size_t)blockIdx.x * cols;
    float m = -__int_as_float(0x7f800000);
    for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, logits[base + j]);
    m = ce_reduce(m, shared, 1);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(logits[base + j] - m);
    s = ce_reduce(s, shared, 0);
    float log_total = logf(s) + m;
    unsigned int target = targets[blockIdx.x];
    for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) {
        float g = expf(logits[base + j] - log_total) * scale;
        grad[base + j] = j == target ? g - scale : g;
    }
    if (threadIdx.x == 0) row_loss[blockIdx.x] = log_total - logits[base + target];
}
