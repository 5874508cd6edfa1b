#!/usr/bin/env bash
# Megatron-LM launch for strategy `megatron_reference` of model `llama3_70b` on 128 nodes × 8 GPUs,
# written by `tessel export`. Run it on every node.
# Notes:
#   - add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path,
#     --tokenizer-type, --lr, --train-iters, --save, ...)
set -euo pipefail
# Megatron-LM requires this with tensor or context parallelism: kernels then run in
# issue order, so communication overlaps compute as scheduled.
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun \
  --nnodes 128 \
  --nproc_per_node 8 \
  --node_rank "${NODE_RANK:-0}" \
  --master_addr "${MASTER_ADDR:-localhost}" \
  --master_port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 4 \
  --context-parallel-size 1 \
  --num-layers-per-virtual-pipeline-stage 4 \
  --sequence-parallel \
  --micro-batch-size 1 \
  --global-batch-size 512 \
  --seq-length 8192 \
  --max-position-embeddings 8192 \
  --num-layers 80 \
  --hidden-size 8192 \
  --ffn-hidden-size 28672 \
  --num-attention-heads 64 \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --normalization RMSNorm \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --position-embedding-type rope \
  --padded-vocab-size 128256 \
  --recompute-granularity selective \
  --bf16 \
  --use-flash-attn \
  --optimizer adam \
  --use-distributed-optimizer

----- file name
megatron_reference.megatron.sh
----- unsupported
----- notes
add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)
