// One bias-corrected Adam step (Kingma & Ba 2015), no weight decay; c1 = 1 - beta1^t and
// c2 = 1 - beta2^t are computed on the host exactly as the CPU backend does.

extern "C" __global__ void adam_step(float* param, const float* grad, float* m, float* v, unsigned int n,
                                     float lr, float beta1, float beta2, float eps, float c1, float c2) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grad[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float mh = m[i] / c1;
    float vh = v[i] / c2;
    param[i] -= lr * mh / (sqrtf(vh) + eps);
}
