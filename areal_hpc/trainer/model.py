"""A Megatron-core GPTModel shaped as the model's family, for this rank's pipeline stage.

Every family (Qwen2, Qwen3, Llama) = RMSNorm, SwiGLU MLP, rotary embeddings with the model's theta
(and Llama 3's frequency scaling), grouped-query attention, tied or untied output embedding; Qwen2
adds a bias on the q/k/v projection, Qwen3 an RMSNorm on each query and key head (qk_layernorm)
and a head size of its own (kv_channels). On GPU the layers come from
Transformer Engine's spec; on CPU from megatron's local spec with PackedCoreAttention in place of
the core attention, so packed (THD) micro-batches run on both.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.config.validate import params_dtype as resolve_params_dtype

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def params_dtype(cfg: ExperimentConfig, device: str) -> torch.dtype:
    """The training dtype on `device` (config.validate.params_dtype decides; ConfigError for fp32
    on CUDA)."""
    return DTYPES[resolve_params_dtype(cfg, device)]


def recompute_settings(cfg: ExperimentConfig) -> dict:
    """trainer.recompute* as megatron-core 0.16.1 TransformerConfig fields (transformer_config.py
    checks them in __post_init__: full needs a method and a layer count, selective neither)."""
    t = cfg.trainer
    if t.recompute == "none":
        return {"recompute_granularity": None}
    if t.recompute == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": list(t.recompute_modules)}
    layers = t.recompute_num_layers
    if layers is None:
        layers = 1 if t.recompute_method == "uniform" else cfg.model.num_layers // t.pp
    return {"recompute_granularity": "full", "recompute_method": t.recompute_method,
            "recompute_num_layers": layers}


def transformer_config(cfg: ExperimentConfig, device: str):
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, t = cfg.model, cfg.trainer
    dtype = params_dtype(cfg, device)
    cpu = device == "cpu"
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.intermediate_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.head_size,
        tensor_model_parallel_size=t.tp,
        pipeline_model_parallel_size=t.pp,
        sequence_parallel=t.sequence_parallel,
        normalization="RMSNorm",
        layernorm_epsilon=m.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=m.qkv_bias,
        qk_layernorm=m.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=cpu,
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=not cpu,
        bias_activation_fusion=False,
        bias_dropout_fusion=not cpu,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        # Packed micro-batches differ in length: pipeline stages exchange shapes first.
        variable_seq_lengths=True,
        # No experts; transformer_config.py:1827 rejects the default MoE dispatcher with
        # variable_seq_lengths even for dense models.
        moe_token_dispatcher_type="alltoall",
        # Losses are token sums; finalize_model_grads divides by the tokens of all micro-batches
        # and data-parallel ranks, giving the token mean over the whole minibatch.
        calculate_per_token_loss=True,
        **recompute_settings(cfg),
    )


def layer_spec(config, device: str):
    """Transformer Engine layers on GPU; on CPU the local spec with packed attention and a norm
    that supports sequence parallelism (see cpu_compat.RMSNorm), also for the final norm and the
    per-head q/k norms."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    if device == "cuda":
        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_layernorm)
    from areal_hpc.trainer.cpu_compat import RMSNorm
    from areal_hpc.trainer.packed_attention import PackedCoreAttention

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=config.qk_layernorm)
    layer = spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = RMSNorm
    attention = layer.self_attention
    qk_norm = {"q_layernorm": RMSNorm, "k_layernorm": RMSNorm} if config.qk_layernorm else {}
    attention.submodules = dataclasses.replace(attention.submodules, core_attention=PackedCoreAttention, **qk_norm)
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config), layer_norm=RMSNorm)


def build_gpt(cfg: ExperimentConfig, device: str, first_stage: bool, last_stage: bool, meta: bool = False):
    """The GPTModel of one pipeline stage (unwrapped, on `device`).

    `meta`: the stage as `device` trains it (its TransformerConfig and dtype), but nothing
    initialised and in megatron's local layers, for a caller that builds it on the meta device
    (trainer/meta_build.py): Transformer Engine's layers need it installed and allocate on a real
    device. Their parameter names differ only as convert.stage_rules(te_names=True) says."""
    from megatron.core.models.gpt import GPTModel

    from areal_hpc.trainer import cpu_compat

    m = cfg.model
    config = transformer_config(cfg, device)
    if meta:
        config.use_cpu_initialization, config.perform_initialization = True, False
    with cpu_compat.cuda_as_cpu():  # the tied output weight of the last stage is moved .cuda()
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(config, "cpu" if meta else device),
            vocab_size=m.vocab_size,
            max_sequence_length=m.max_position_embeddings,
            pre_process=first_stage,
            post_process=last_stage,
            parallel_output=True,
            share_embeddings_and_output_weights=m.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=m.rope_theta,
            # Llama 3's scaling: megatron-core takes the factor only (config/validate.py refuses
            # other parameters).
            rope_scaling=m.rope_scaling is not None,
            rope_scaling_factor=(m.rope_scaling or {}).get("factor", 8.0),
        )
    return model if meta else model.to(device)
