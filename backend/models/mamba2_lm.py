"""Mamba-2 (`mamba2`: Mistral's Mamba-Codestral-7B; state-spaces' mamba2-130m .. 2.7b, whose config.json in the
mamba_ssm package's format loads as its transformers config: mamba1.mamba_ssm_config): an
attention-free decoder, every layer x + Mamba-2(RMSNorm(x)) (mamba2.py, the mixer the hybrids share) with no MLP,
then a final RMSNorm and the head (untied unless `tie_word_embeddings`, transformers' default).

Tensors (`backbone.` stripped): `embeddings` (the original checkpoints' `embedding`), `layers.{i}.norm`,
`layers.{i}.mixer.*` (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj), `norm_f`, `lm_head` where untied.
Sizes: `num_heads` heads of `head_dim` over intermediate = expand * hidden (which must equal them), `state_size` in
`n_groups` groups, `conv_kernel` taps, `chunk_size`, biases where `use_conv_bias` / `use_bias`, dt clamped to
`time_step_limit`. The output norm as the config says, as the original Mamba-2 reads it: per group RMSNorm(y *
silu(z)) (`norm_before_gate` false, the published models'), RMSNorm(y) * silu(z) (true), or y * silu(z) without a
norm (`rms_norm` false); transformers' class always runs the first.

The model has no attention: the paged KV cache holds no layer and each sequence's whole memory is its recurrent
state. transformers keeps the residual stream in fp32 (`residual_in_fp32`); here it is in the model's dtype (the
same in fp32). The config names no longest sequence: mamba1.DEFAULT_MAX_POSITIONS, or `max_position_embeddings`
where a config sets it. Refused by name: a `hidden_act` other than silu, heads that do not fill expand * hidden."""
from tritonformer.backend.models.mamba1 import attention_free_spec, backbone_renamed
from tritonformer.backend.models.mamba2 import KIND, Mamba2Decoder, Mamba2Spec, hybrid_spec
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames

NAMES = WeightNames(attn_norm="norm", embed="embeddings.weight", final_norm="norm_f.weight")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    return cfg, backbone_renamed(state)


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Mamba-2 hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    inner = int(cfg.get("expand", 2) * cfg["hidden_size"])
    heads, head_dim = cfg.get("num_heads", 128), cfg.get("head_dim", 64)
    if heads * head_dim != inner:
        raise ValueError(f"Mamba-2 num_heads {heads} x head_dim {head_dim} is not expand x hidden_size {inner} "
                         f"(supported: num_heads x head_dim = expand x hidden_size)")
    if not cfg.get("rms_norm", True):
        norm = "none"
    else:
        norm = "before_gate" if cfg.get("norm_before_gate", False) else "gated"
    limit = cfg.get("time_step_limit") or (0.0, float("inf"))
    mamba = Mamba2Spec(num_heads=heads, head_dim=head_dim, state_size=cfg.get("state_size", 128),
                       num_groups=cfg.get("n_groups", 8), intermediate_size=inner,
                       conv_kernel=cfg.get("conv_kernel", 4), chunk_size=cfg.get("chunk_size") or 256,
                       conv_bias=bool(cfg.get("use_conv_bias", True)),
                       proj_bias=bool(cfg.get("use_bias", False)), norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
                       time_step_limit=(float(limit[0]), float(limit[1])), norm=norm)
    return hybrid_spec(attention_free_spec(cfg, KIND, NAMES, tie_default=False), mamba, mixer_prefix="mixer.")


MODEL = Mamba2Decoder
