"""Jamba (`jamba`: AI21's Jamba-v0.1, Jamba-1.5-Mini / Large): Llama's pre-norm block where most layers run Mamba-1
(mamba1.py, under `mamba.`, with RMSNorms of their own on dt, B and C: `dt_layernorm` / `b_layernorm` /
`c_layernorm`, eps `rms_norm_eps`) in place of attention; layer i attends where i % `attn_layer_period` ==
`attn_layer_offset` (multi-head attention with GQA, no rotary, no biases). Every layer's MLP (`feed_forward`,
after `pre_ff_layernorm`) is a SwiGLU MLP, or in layers where i % `expert_layer_period` == `expert_layer_offset`
(with more than one expert) `num_experts` experts of `intermediate_size`, each token to the top
`num_experts_per_tok` by softmax probability, not renormalised, the weights rounded to the activation dtype
(moe.py; the router `feed_forward.router`). The final norm is `final_layernorm`, the head untied unless
`tie_word_embeddings`.

Refused by name: a `hidden_act` other than silu, layer offsets not below their periods."""
from tritonformer.backend.models.mamba1 import KIND, Mamba1Decoder, Mamba1Spec, mamba1_spec
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames, spec_from_hf

NAMES = WeightNames(gate="feed_forward.gate_proj", up="feed_forward.up_proj", down="feed_forward.down_proj",
                    mlp_norm="pre_ff_layernorm", final_norm="final_layernorm.weight")
MOE_NAMES = MoeNames(blocks=("feed_forward",), routers=("router",), shared_gate=None)


def _periodic(cfg: dict, period: str, offset: str, default_period: int, default_offset: int) -> list[bool]:
    """Per layer whether i % cfg[period] == cfg[offset]."""
    every, at = cfg.get(period, default_period), cfg.get(offset, default_offset)
    if not 0 <= at < every:
        raise ValueError(f"Jamba {offset} {at} is not below {period} {every} (supported: {offset} from 0 to "
                         f"{period} - 1)")
    return [i % every == at for i in range(cfg["num_hidden_layers"])]


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Jamba hidden_act {cfg['hidden_act']!r} (supported: hidden_act silu)")
    layers = cfg["num_hidden_layers"]
    attending = _periodic(cfg, "attn_layer_period", "attn_layer_offset", 8, 4)
    experts = num_experts(cfg, 16)
    moe_layers = [e and experts > 1 for e in _periodic(cfg, "expert_layer_period", "expert_layer_offset", 2, 1)]
    moe = None
    if any(moe_layers):
        moe = MoeSpec(num_experts=experts, top_k=cfg.get("num_experts_per_tok", 2),
                      intermediate_size=cfg["intermediate_size"], normalize=False, round_weights=True,
                      layers=tuple(moe_layers), names=MOE_NAMES)
    mixers = tuple(None if a else KIND for a in attending)
    spec = spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_layers=(False,) * layers, moe=moe,
                        mixers=mixers if any(mixers) else (), names=NAMES)
    if not spec.mixers:  # (every layer attends)
        return spec
    hidden, rank = cfg["hidden_size"], cfg.get("mamba_dt_rank", "auto")
    mamba = Mamba1Spec(intermediate_size=int(cfg.get("mamba_expand", 2) * hidden),
                       state_size=cfg.get("mamba_d_state", 16),
                       dt_rank=-(-hidden // 16) if rank == "auto" else int(rank),
                       conv_kernel=cfg.get("mamba_d_conv", 4), conv_bias=bool(cfg.get("mamba_conv_bias", True)),
                       proj_bias=bool(cfg.get("mamba_proj_bias", False)), bcdt_norm="weighted",
                       bcdt_norm_eps=cfg.get("rms_norm_eps", 1e-6))
    return mamba1_spec(spec, mamba, mixer_prefix="mamba.")


MODEL = Mamba1Decoder
