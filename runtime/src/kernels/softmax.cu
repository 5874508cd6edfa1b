// Causal softmax of attention scores, one block per score row (blockDim.x a power of two).
// Rows are [batch·heads·q_len, kv_len]; row r is query position q_offset + r % q_len and sees keys
// 0..=that position; masked entries become 0. `scale` multiplies the scores first (1/sqrt(d)).

__device__ float block_reduce(float v, float* shared, int is_max) {
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

extern "C" __global__ void causal_softmax(float* scores, unsigned int q_len, unsigned int kv_len,
                                          unsigned int q_offset, float scale) {
    extern __shared__ float shared[];
    float* row = scores + (size_t)blockIdx.x * kv_len;
    unsigned int visible = q_offset + blockIdx.x % q_len + 1;
    if (visible > kv_len) visible = kv_len;
    float m = -__int_as_float(0x7f800000);
    for (unsigned int j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, row[j] * scale);
    m = block_reduce(m, shared, 1);
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < visible; j += blockDim.x) s += expf(row[j] * scale - m);
    s = block_reduce(s, shared, 0);
    for (unsigned int j = threadIdx.x; j < kv_len; j += blockDim.x)
        row[j] = j < visible ? expf(row[j] * scale - m) / s : 0.0f;
}

// dscores = p * (dp - sum(p * dp)) * scale, per row.
extern "C" __global__ void causal_softmax_backward(const float* probs, const float* dprobs, float* dscores,
                                                   unsigned int kv_len, float scale) {
    extern __shared__ float shared[];
    size_t base = (size_t)blockIdx.x * kv_len;
    float dot = 0.0f;
    for (unsigned int j = threadIdx.x; j < kv_len; j += blockDim.x) dot += probs[base + j] * dprobs[base + j];
    dot = block_reduce(dot, shared, 0);
    for (unsigned int j = threadIdx.x; j < kv_len; j += blockDim.x)
        dscores[base + j] = probs[base + j] * (dprobs[base + j] - dot) * scale;
}
