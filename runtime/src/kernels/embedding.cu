// Row gather (embedding lookup) and its backward, a scatter-add of rows. The scatter runs one
// thread per column and walks the indices in order, so repeated rows add in the same order as
// the CPU backend and the result is deterministic without atomics.

extern "C" __global__ void gather_rows(const float* table, const unsigned int* rows, float* out,
                                       unsigned int count, unsigned int cols) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count * cols) return;
    unsigned int r = i / cols, c = i % cols;
    out[i] = table[(size_t)rows[r] * cols + c];
}

extern "C" __global__ void scatter_add_rows(float* dst, const unsigned int* rows, const float* src,
                                            unsigned int count, unsigned int cols) {
    unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (unsigned int r = 0; r < count; ++r) dst[(size_t)rows[r] * cols + c] += src[(size_t)r * cols + c];
}
