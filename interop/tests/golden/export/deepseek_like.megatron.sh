#!/usr/bin/env bash
# Megatron-LM launch for strategy `moe_cp_zero2` of model `deepseek_like` on 8 nodes × 8 GPUs,
# written by `tessel export`. Run it on every node.
# Not expressible in this format:
#   - zero = 2: Megatron-LM's distributed optimizer shards optimizer state only (ZeRO-1), so
#     gradients stay replicated; written as --use-distributed-optimizer. For ZeRO-2 use torch
#     FSDP (torchtitan) or DeepSpeed; recent Megatron-LM also has --use-megatron-fsdp with
#     --data-parallel-sharding-strategy optim_grads
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
  --nnodes 8 \
  --nproc_per_node 8 \
  --node_rank "${NODE_RANK:-0}" \
  --master_addr "${MASTER_ADDR:-localhost}" \
  --master_port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 2 \
  --context-parallel-size 2 \
  --expert-model-parallel-size 8 \
  --num-virtual-stages-per-pipeline-rank 2 \
  --decoder-first-pipeline-num-layers 12 \
  --decoder-last-pipeline-num-layers 16 \
  --micro-batch-size 2 \
  --global-batch-size 512 \
  --seq-length 16384 \
  --max-position-embeddings 16384 \
  --num-layers 28 \
  --hidden-size 2048 \
  --ffn-hidden-size 10944 \
  --num-attention-heads 16 \
  --group-query-attention \
  --num-query-groups 8 \
  --swiglu \
  --normalization RMSNorm \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --position-embedding-type rope \
  --padded-vocab-size 102400 \
  --num-experts 64 \
  --moe-router-topk 6 \
  --moe-ffn-hidden-size 1408 \
  --moe-shared-expert-intermediate-size 2816 \
  --moe-layer-freq '([0]*1+[1]*27)' \
  --moe-token-dispatcher-type alltoall \
  --moe-grouped-gemm \
  --bf16 \
  --use-flash-attn \
  --optimizer adam \
  --use-distributed-optimizer

----- file name
moe_cp_zero2.megatron.sh
----- unsupported
zero = 2: Megatron-LM's distributed optimizer shards optimizer state only (ZeRO-1), so gradients stay replicated; written as --use-distributed-optimizer. For ZeRO-2 use torch FSDP (torchtitan) or DeepSpeed; recent Megatron-LM also has --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads
----- notes
capacity_factor 1.0 is written as Megatron-LM's dropless default (no --moe-expert-capacity-factor)
add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)
