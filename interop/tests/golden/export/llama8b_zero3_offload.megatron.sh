#!/usr/bin/env bash
# Megatron-LM launch for strategy `zero3_offload` of model `llama3_8b` on 2 nodes × 8 GPUs,
# written by `tessel export`. Run it on every node.
# Not expressible in this format:
#   - zero = 3: Megatron-LM's distributed optimizer shards optimizer state only (ZeRO-1), so
#     gradients and weights stay replicated; written as --use-distributed-optimizer. For ZeRO-3
#     use torch FSDP (torchtitan) or DeepSpeed; recent Megatron-LM also has --use-megatron-fsdp
#     with --data-parallel-sharding-strategy optim_grads_params
#   - offload.weights = 1: Megatron-LM has no flag to keep weights in host memory
# Notes:
#   - add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path,
#     --tokenizer-type, --lr, --train-iters, --save, ...)
set -euo pipefail
torchrun \
  --nnodes 2 \
  --nproc_per_node 8 \
  --node_rank "${NODE_RANK:-0}" \
  --master_addr "${MASTER_ADDR:-localhost}" \
  --master_port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 1 \
  --context-parallel-size 1 \
  --micro-batch-size 2 \
  --global-batch-size 256 \
  --seq-length 8192 \
  --max-position-embeddings 8192 \
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
  --padded-vocab-size 128256 \
  --recompute-granularity full \
  --recompute-method uniform \
  --recompute-num-layers 1 \
  --bf16 \
  --use-flash-attn \
  --optimizer adam \
  --use-distributed-optimizer \
  --optimizer-cpu-offload \
  --optimizer-offload-fraction 0.5 \
  --use-precision-aware-optimizer

----- file name
zero3_offload.megatron.sh
----- unsupported
zero = 3: Megatron-LM's distributed optimizer shards optimizer state only (ZeRO-1), so gradients and weights stay replicated; written as --use-distributed-optimizer. For ZeRO-3 use torch FSDP (torchtitan) or DeepSpeed; recent Megatron-LM also has --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads_params
offload.weights = 1: Megatron-LM has no flag to keep weights in host memory
----- notes
add data, tokenizer, learning-rate schedule, iteration and checkpoint flags (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)
