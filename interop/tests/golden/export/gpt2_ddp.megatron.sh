#!/usr/bin/env bash
# Megatron-LM launch for strategy `ddp` of model `gpt2` on 1 node × 8 GPUs,
# written by `tessel export`. Run it on every node.
# Notes:
#   - add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path,
#     --tokenizer-type, --lr, --train-iters, --save, ...)
set -euo pipefail
torchrun \
  --nnodes 1 \
  --nproc_per_node 8 \
  --node_rank "${NODE_RANK:-0}" \
  --master_addr "${MASTER_ADDR:-localhost}" \
  --master_port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 1 \
  --context-parallel-size 1 \
  --micro-batch-size 16 \
  --global-batch-size 512 \
  --seq-length 1024 \
  --max-position-embeddings 1024 \
  --num-layers 12 \
  --hidden-size 768 \
  --ffn-hidden-size 3072 \
  --num-attention-heads 12 \
  --normalization LayerNorm \
  --position-embedding-type learned_absolute \
  --padded-vocab-size 50257 \
  --fp16 \
  --optimizer sgd

----- file name
ddp.megatron.sh
----- unsupported
----- notes
add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)
