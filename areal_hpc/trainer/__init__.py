"""The Megatron-core trainer: Qwen2 with TP/PP/DP, decoupled PPO over packed micro-batches.

Pure logic (packing, advantages, losses, the weight-name mapping) imports no megatron-core; the
engine, model and parallel modules do, so import them only on trainer ranks.
"""
