// Rotary position embedding, rotate-half form, as the CPU backend computes it: one thread per
// (row, head, i < head_dim/2) pair; row r sits at position offset + r % seq_len. `inverse`
// rotates back (the backward). theta = pos * base^(-2i/head_dim), base 10000.

#define ROPE_BASE 10000.0f

extern "C" __global__ void rope(const float* x, float* y, unsigned int rows, unsigned int cols,
                                unsigned int head_dim, unsigned int seq_len, unsigned int offset,
                                int inverse) {
    unsigned int half = head_dim / 2;
    unsigned int pairs_per_row = cols / head_dim * half;
    unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * pairs_per_row) return;
    unsigned int r = t / pairs_per_row;
    unsigned int p = t % pairs_per_row;
    unsigned int head = p / half, i = p % half;
    float pos = (float)(offset + r % seq_len);
    float theta = pos * powf(ROPE_BASE, -2.0f * (float)i / (float)head_dim);
    float s, c;
    sincosf(theta, &s, &c);
    if (inverse) s = -s;
    size_t base = (size_t)r * cols + head * head_dim;
    float a = x[base + i], b = x[base + i + half];
    y[base + i] = a * c - b * s;
    y[base + i + half] = a * s + b * c;
}
