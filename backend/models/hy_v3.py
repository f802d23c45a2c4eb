"""Hy3 (`hy_v3`: Tencent's Hy3-preview): Qwen3's attention (per-head q / k RMSNorms before the rotary; biases on
the four projections where `attention_bias`) with experts in the layers `mlp_layer_types` calls sparse (all but
the first by default), routed as DeepSeek-V3 routes: sigmoid scores from fp32 router logits, the top k chosen by
score plus `e_score_correction_bias`, renormalised and scaled by `router_scaling_factor`; `num_shared_experts`
shared experts (one MLP of that many expert widths) added as they are. transformers adds the shared experts'
output to the routed sum in fp32 (`enable_moe_fp32_combine`); the decoder adds them in the activation dtype, one
rounding apart in bf16, none in fp32. Published checkpoints name the router `router.gate`, the bias
`expert_bias` and the shared experts `shared_mlp`: renamed at load. MLP biases (`mlp_bias`) are refused: the
shared experts have none here. The multi-token-prediction layer (`layers.{num_hidden_layers}`) is not read."""
import re

from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf, tensors_renamed

# published name -> transformers', inside a layer's `mlp.`
RENAMES = tuple((re.compile(re.escape(old)), new) for old, new in (
    ("mlp.router.gate.", "mlp.gate."), ("mlp.expert_bias", "mlp.e_score_correction_bias"),
    ("mlp.shared_mlp.", "mlp.shared_experts.")))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    return cfg, tensors_renamed(state, RENAMES)


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("mlp_bias"):
        raise ValueError("Hy3 with mlp_bias is not supported (supported: mlp_bias false)")
    layers = cfg["num_hidden_layers"]
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    expert, shared = cfg.get("moe_intermediate_size", 1536), cfg.get("num_shared_experts", 1) or 0
    moe = MoeSpec(num_experts=num_experts(cfg, 192), top_k=cfg.get("num_experts_per_tok") or 8,
                  intermediate_size=expert, normalize=True, round_weights=False,
                  layers=tuple(t == "sparse" for t in types), shared_intermediate_size=expert * shared,
                  names=MoeNames(shared="mlp.shared_experts", shared_gate=None), scoring="sigmoid", score_bias=True,
                  scale=float(cfg.get("router_scaling_factor", 2.826)), router_fp32=True)
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, default_theta=11158840.0, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bias,
                        o_bias=bias, qk_norm=True, moe=moe)


MODEL = TransformerDecoder
