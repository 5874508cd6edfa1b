#!/usr/bin/env bash
# Megatron-LM launch for strategy `uneven_stages` of model `llama3_1_405b` on 128 nodes × 8 GPUs,
# written by `tessel export`. Run it on every node.
# Notes:
#   - 126 layers do not divide over pp·interleave = 16·1 chunks and the strategy sets no
#     `stages`; exported with layers per stage [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]
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
  --pipeline-model-parallel-size 16 \
  --context-parallel-size 1 \
  --decoder-first-pipeline-num-layers 7 \
  --decoder-last-pipeline-num-layers 7 \
  --sequence-parallel \
  --micro-batch-size 1 \
  --global-batch-size 2048 \
  --seq-length 8192 \
  --max-position-embeddings 131072 \
  --num-layers 126 \
  --hidden-size 16384 \
  --ffn-hidden-size 53248 \
  --num-attention-heads 128 \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --normalization RMSNorm \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --position-embedding-type rope \
  --padded-vocab-size 128256 \
  --recompute-granularity full \
  --recompute-method block \
  --recompute-num-layers 2 \
  --bf16 \
  --fp8-format hybrid \
  --use-flash-attn \
  --optimizer adam \
  --use-distributed-optimizer

----- file name
uneven_stages.megatron.sh
----- unsupported
----- notes
126 layers do not divide over pp·interleave = 16·1 chunks and the strategy sets no `stages`; exported with layers per stage [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]
add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)
