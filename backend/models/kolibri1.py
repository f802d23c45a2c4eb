"""Kolibri-1 (`kolibri1`: Aleph Alpha's Kolibri-1): EXAONE 4's hybrid attention in GLM-4's sandwich block, with
DeepSeek-V3's kind of experts in every layer, routed by logit.

- Attention: per-head q / k RMSNorms (Qwen3's) before the rotary; where `sliding_window` is set, the layers
  `layer_types` calls "sliding_attention" (by default four of every five, every fifth global) attend to the last
  `sliding_window` keys and alone rotate q and k, the global layers NoPE (without a window every layer rotates).
- Norms: before and after attention and the MLP (`input_layernorm` / `post_self_attn_layernorm`,
  `post_attention_layernorm` / `post_mlp_layernorm`: GLM-4's sandwich), each output normed before its residual add.
- MLP: in every layer `num_experts` SwiGLU experts of `moe_intermediate_size` and one shared expert of
  `shared_expert_intermediate_size` added as it is. The router's logits are fp32 (fp32 rows and weights); the k
  experts of the largest logit + `e_score_correction_bias` are chosen (the logit, not sigmoid(logit) as DeepSeek-V3
  chooses: MoeSpec.logit_choice), weighted by sigmoid(logit), renormalised where `norm_topk_prob` (false by
  default), unscaled.
- The published checkpoints' names (`post_attn_norm`, `post_ffn_norm`, `moe.router.expert_bias`) load as
  transformers' (adapt).

transformers' router on a GPU takes the logits from bf16 rows and weights in one GEMM with fp32 output; here (as
on its CPU path) from fp32 ones: the same choice but at near ties."""
from dataclasses import replace

from tritonformer.backend.models.glm import GLM4_NAMES
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf

NAMES = replace(GLM4_NAMES, gate_up=None)  # (GLM-4's norms; no dense MLP)
# (published, transformers') parts of tensor names, transformers' conversion mapping for kolibri1
PUBLISHED_NAMES = ((".post_attn_norm.", ".post_self_attn_layernorm."), (".post_ffn_norm.", ".post_mlp_layernorm."),
                   (".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias"))


def default_layer_types(layers: int) -> list[str]:
    """transformers' Kolibri1Config rule where `layer_types` is absent: every fifth layer global."""
    return ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)]


def from_hf(cfg: dict) -> DecoderSpec:
    layers = cfg["num_hidden_layers"]
    cfg = {"layer_types": default_layer_types(layers), "sliding_window": 513, "head_dim": 128, **cfg}
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Kolibri-1 hidden_act {cfg['hidden_act']!r} (supported: silu)")
    window = cfg.get("sliding_window")
    windows = layer_windows(cfg, window)
    # (transformers: q and k rotate where there is no window, or on the sliding layers only)
    rope_layers = tuple(w is not None for w in windows) if window else ()
    moe = MoeSpec(num_experts=num_experts(cfg, 384), top_k=cfg.get("num_experts_per_tok", 6),
                  intermediate_size=cfg.get("moe_intermediate_size", 512),
                  normalize=bool(cfg.get("norm_topk_prob", False)), round_weights=False, layers=(True,) * layers,
                  shared_intermediate_size=cfg.get("shared_expert_intermediate_size", 512),
                  names=MoeNames(shared="mlp.shared_experts", shared_gate=None), scoring="sigmoid", score_bias=True,
                  router_fp32=True, logit_choice=True)
    # (no dense MLP in any layer: transformers' config has no intermediate_size)
    return spec_from_hf({"intermediate_size": 0, **cfg}, norm_eps=cfg.get("rms_norm_eps", 1e-6), qk_norm=True,
                        sandwich_norms=True, layer_windows=windows, rope_layers=rope_layers, moe=moe, names=NAMES)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The published checkpoints' names (as save_pretrained writes them) as transformers' own, which the decoder
    reads: `post_attn_norm` / `post_ffn_norm` -> `post_self_attn_layernorm` / `post_mlp_layernorm`, the router's
    `moe.router.expert_bias` -> `mlp.gate.e_score_correction_bias`."""
    return cfg, {_renamed(name): t for name, t in state.items()}


def _renamed(name: str) -> str:
    for published, own in PUBLISHED_NAMES:
        if published in name:
            return name.replace(published, own)
    return name


MODEL = TransformerDecoder
