"""Mamba (`mamba`: state-spaces' mamba-130m-hf .. mamba-2.8b-hf) and Falcon-Mamba (`falcon_mamba`: TII's
Falcon-Mamba-7B): attention-free decoders, every layer x + Mamba-1(RMSNorm(x)) (mamba1.py) with no MLP, then a
final RMSNorm and the head (tied to the embeddings unless `tie_word_embeddings` says otherwise).

Tensors (`backbone.` stripped): `embeddings` (the original checkpoints' `embedding`), `layers.{i}.norm`,
`layers.{i}.mixer.*`, `norm_f`, and `lm_head` where untied. The mixer's widths as transformers reads them:
`intermediate_size` (expand * hidden where the config has none), dt_rank = ceil(hidden / 16) where
`time_step_rank` is "auto". A checkpoint in state-spaces' own format (the mamba_ssm package's config.json:
`d_model`, `n_layer`, `ssm_cfg`) loads as its transformers config (mamba1.mamba_ssm_config). Falcon-Mamba
RMS-normalises dt, B and C without a weight (`mixer_rms_eps`).

The model has no attention: the paged KV cache holds no layer (its blocks only count tokens for the scheduler)
and each sequence's whole memory is its recurrent state. transformers keeps the residual stream in fp32
(`residual_in_fp32`); here it is in the model's dtype, as in every family (the same in fp32). The config names
no longest sequence: mamba1.DEFAULT_MAX_POSITIONS, or `max_position_embeddings` where a config sets it. Refused
by name: a `hidden_act` other than silu."""
import math

from tritonformer.backend.models.mamba1 import (
    KIND, Mamba1Decoder, Mamba1Spec, attention_free_spec, backbone_renamed, mamba1_spec,
)
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames

NAMES = WeightNames(attn_norm="norm", embed="embeddings.weight", final_norm="norm_f.weight")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    return cfg, backbone_renamed(state)


def from_hf(cfg: dict) -> DecoderSpec:
    family = "Falcon-Mamba" if cfg.get("model_type") == "falcon_mamba" else "Mamba"
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported {family} hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    hidden = cfg["hidden_size"]
    rank = cfg.get("time_step_rank", "auto")
    inner = cfg.get("intermediate_size") or int(cfg.get("expand", 2) * hidden)
    mamba = Mamba1Spec(intermediate_size=inner, state_size=cfg.get("state_size", 16),
                       dt_rank=math.ceil(hidden / 16) if rank == "auto" else int(rank),
                       conv_kernel=cfg.get("conv_kernel", 4), conv_bias=bool(cfg.get("use_conv_bias", True)),
                       proj_bias=bool(cfg.get("use_bias", False)),
                       bcdt_norm="weightless" if family == "Falcon-Mamba" else "none",
                       bcdt_norm_eps=cfg.get("mixer_rms_eps", 1e-6))
    return mamba1_spec(attention_free_spec(cfg, KIND, NAMES), mamba)


MODEL = Mamba1Decoder
