#!/usr/bin/env bash
# Megatron-LM launch for strategy `expert_parallel` of model `mixtral_8x7b` on 16 nodes × 8 GPUs,
# written by `tessel export`. Run it on every node.
# Notes:
#   - capacity_factor 1.0 is written as Megatron-LM's dropless default (no
#     --moe-expert-capacity-factor)
#   - add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path,
#     --tokenizer-type, --lr, --train-iters, --save, ...)
set -euo pipefail
# Megatron-LM requires this with tensor or context parallelism: kernels then run in
# issue order, so communication overlaps compute as scheduled.
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun \
  --nnodes 16 \
  --nproc_per_node 8 \
  --node_rank "${NODE_RANK:-0}" \
  --master_addr "${MASTER_ADDR:-localhost}" \
  --master_port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 4 \
  --context-parallel-size 1 \
  --expert-model-parallel-size 8 \
  --sequence-parallel \
  --micro-batch-size 1 \
  --global-batch-size 1024 \
  --seq-length 4096 \
  --max-position-embeddings 32768 \
  --num-layers 32 \
  --hidden-size 4096 \
  --ffn-hidden-size 14336 \
  --num-attention-heads 32 \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --normalization RMSNorm \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --position-embedding-type rope \
  --padded-vocab-size 32000 \
  --num-experts 8 \
  --moe-router-topk 2 \
  --moe-ffn-hidden-size 14336 \
  --moe-token-dispatcher-type alltoall \
  --moe-grouped-gemm \
  --recompute-granularity full \
  --recompute-method uniform \
  --recompute-num-layers 1 \
  --bf16 \
  --use-flash-attn \
  --optimizer adam \
  --use-distributed-optimizer

----- file name
expert_parallel.megatron.sh
----- unsupported
----- notes
capacity_factor 1.0 is written as Megatron-LM's dropless default (no --moe-expert-capacity-factor)
add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)
