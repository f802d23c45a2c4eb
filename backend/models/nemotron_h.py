"""Nemotron-H (`nemotron_h`: NVIDIA's Nemotron-H 8B / 47B / 56B, Nemotron Nano 9B / 12B v2, Nemotron 3 Nano /
Super): a stack of single-operator blocks, each x + op(RMSNorm(x)) with op one of a Mamba-2 mixer ("M",
mamba2.py), attention without a rotary ("*", NoPE; no biases), a squared-ReLU MLP ("-": `up_proj`, `down_proj`,
biases where `mlp_bias`) or a mixture of experts ("E", Nemotron 3's), as `hybrid_override_pattern` (or
transformers' `layers_block_type`) lists them.

A MoE block (moe.py) routes each normalised row x by s = sigmoid(W_gate x) (logits in fp32): the k
(`num_experts_per_tok`) experts of the largest s + `e_score_correction_bias` (the bias only chooses), among the
best `topk_group` of `n_group` groups of consecutive experts (each ranked by the sum of its two largest s + bias),
weighted by their s, renormalised over the k (+ 1e-20) where `norm_topk_prob`, times `routed_scaling_factor`.
Each expert is up, squared ReLU, down with no gate (`moe_intermediate_size` columns); their weighted rows are summed
in fp32 and rounded once. With `moe_latent_size` set (Nemotron 3 Super) the experts read and write latent rows:
x times `fc1_latent_proj` before them, their rounded sum times `fc2_latent_proj` after; the router and the shared
expert read x itself. A shared expert (up, squared ReLU, down of `moe_shared_expert_intermediate_size`) on x is
added. MoE blocks with `mlp_bias` (biases on the shared expert and the latent projections) are refused by name.

The shared decoder's layer is attention (or a mixer) then an MLP, each after its own norm: so each "M" or "*"
block and the "-" or "E" block right after it are one layer here (an "E" one's MLP the MoE, DecoderSpec.moe),
and an "M" or "*" followed by another is a layer without an MLP (DecoderSpec.mlp_layers). `adapt` renames the
published blocks' tensors (under `backbone.` or transformers' `model.`: `layers.{i}.norm`, `layers.{i}.mixer.*`,
`embeddings`, `norm_f`) to those layers' names. An MLP or MoE block that follows no mixer or attention block is
refused by name.

transformers' Mamba-2 here clamps dt from below at `time_step_min` in its prefill (and ignores
`time_step_limit`); the mixer clamps there in both forms (mamba2.py). Its block norms multiply by their
weight in fp32 and round once; the decoder's norms are the shared ones (a rounding apart in bf16, none in
fp32)."""
import re

from tritonformer.backend.models.mamba2 import Mamba2Decoder, Mamba2Spec, hybrid_spec
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames, spec_from_hf

KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
NAMES = WeightNames(up="mlp.up_proj", down="mlp.down_proj", embed="embeddings.weight", final_norm="norm_f.weight")
# A MoE block's tensors under the layer's `mlp.`: the router `gate` (and its `e_score_correction_bias`), the experts one
# by one as published (`experts.{j}.up_proj`) or stacked as transformers holds them, the shared expert
MOE_NAMES = MoeNames(routers=("gate",), stacked=(("experts.up_proj", "experts.down_proj"),),
                     shared="mlp.shared_experts", shared_gate=None)


def block_kinds(cfg: dict) -> list[str]:
    """Each published block's kind, transformers' names ("linear_attention", "full_attention", "mlp",
    "moe"), from `layers_block_type` / `layer_types` or the pattern string."""
    kinds = cfg.get("layers_block_type") or cfg.get("layer_types")
    if kinds is None:
        pattern = cfg.get("hybrid_override_pattern")
        if pattern is None:
            raise ValueError("Nemotron-H needs `hybrid_override_pattern` (or `layers_block_type`): each block's kind")
        if set(pattern) - set(KINDS):
            raise ValueError(f"Nemotron-H hybrid_override_pattern {pattern!r}: supported kinds are M, *, -, E")
        kinds = [KINDS[ch] for ch in pattern]
    return [{"mamba": "linear_attention", "attention": "full_attention"}.get(k, k) for k in kinds]


def layers(cfg: dict) -> list[tuple[int, int | None]]:
    """The decoder's layers as (the block of its Mamba-2 mixer or attention, the MLP or MoE block after it or None)."""
    kinds = block_kinds(cfg)
    out: list[tuple[int, int | None]] = []
    for i, kind in enumerate(kinds):
        if kind in ("linear_attention", "full_attention"):
            out.append((i, None))
        elif kind in ("mlp", "moe"):
            if not out or out[-1][1] is not None:
                what = "an MLP" if kind == "mlp" else "a mixture of experts"
                raise ValueError(f"Nemotron-H block {i} is {what} that follows no Mamba-2 or attention block (not "
                                 f"supported: each MLP or MoE block follows one)")
            out[-1] = (out[-1][0], i)
        else:
            raise ValueError(f"Nemotron-H block {i}'s kind {kind!r} is not supported (supported: M / "
                             f"linear_attention, * / full_attention, - / mlp, E / moe)")
    return out


def moe_spec(cfg: dict, moe_layers: tuple[bool, ...]) -> MoeSpec:
    """The MoE blocks' options (the module's docstring) for the decoder's layers `moe_layers` names."""
    if cfg.get("mlp_bias"):
        raise ValueError("Nemotron-H MoE blocks with mlp_bias (biases on the shared expert and the latent projections) "
                         "are not supported (supported: mlp_bias false where there are MoE blocks)")
    return MoeSpec(num_experts=num_experts(cfg, 8), top_k=cfg.get("num_experts_per_tok", 2),
                   intermediate_size=cfg.get("moe_intermediate_size", 7688), normalize=cfg.get("norm_topk_prob", True),
                   round_weights=False, layers=moe_layers,
                   shared_intermediate_size=cfg.get("moe_shared_expert_intermediate_size", 7688), names=MOE_NAMES,
                   scoring="sigmoid", score_bias=True, scale=float(cfg.get("routed_scaling_factor", 1.0)),
                   router_fp32=True, groups=cfg.get("n_group", 1), kept_groups=cfg.get("topk_group", 1),
                   group_score="top2_sum", gated=False, latent_size=cfg.get("moe_latent_size") or 0)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The published blocks' tensors under the decoder's layers' names (see the module's docstring); a state
    already named so (no `layers.{i}.norm.weight`) as it is."""
    state = {(name[len("backbone."):] if name.startswith("backbone.") else name): t for name, t in state.items()}
    if not any(re.fullmatch(r"layers\.\d+\.norm\.weight", name) for name in state):
        return cfg, state
    kinds = block_kinds(cfg)
    renamed = {name: t for name, t in state.items() if not name.startswith("layers.")}
    for j, (mixer, mlp) in enumerate(layers(cfg)):
        own = "mamba." if kinds[mixer] == "linear_attention" else "self_attn."
        for block, norm, to in ((mixer, "input_layernorm", own), (mlp, "post_attention_layernorm", "mlp.")):
            if block is None:
                continue
            prefix = f"layers.{block}."
            for name, t in state.items():
                if name == prefix + "norm.weight":
                    renamed[f"layers.{j}.{norm}.weight"] = t
                elif name.startswith(prefix + "mixer."):
                    renamed[f"layers.{j}.{to}{name[len(prefix + 'mixer.'):]}"] = t
    return cfg, renamed


def from_hf(cfg: dict) -> DecoderSpec:
    pairs = layers(cfg)
    kinds = block_kinds(cfg)
    if cfg.get("mlp_hidden_act", "relu2") != "relu2":
        raise ValueError(f"unsupported Nemotron-H mlp_hidden_act {cfg['mlp_hidden_act']!r} (supported: relu2)")
    if cfg.get("mamba_hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Nemotron-H mamba_hidden_act {cfg['mamba_hidden_act']!r} (supported: silu)")
    mixers = tuple("mamba2" if kinds[m] == "linear_attention" else None for m, _ in pairs)
    moe_layers = tuple(mlp is not None and kinds[mlp] == "moe" for _, mlp in pairs)
    inter = cfg.get("intermediate_size", 21504)
    spec = spec_from_hf({"head_dim": 128, **cfg, "num_hidden_layers": len(pairs), "intermediate_size": inter},
                        norm_eps=cfg.get("layer_norm_epsilon", 1e-5), gated_mlp=False, activation="relu2",
                        rope_layers=(False,) * len(pairs), mixers=mixers if any(mixers) else (),
                        mlp_layers=tuple(mlp is not None for _, mlp in pairs), names=NAMES,
                        moe=moe_spec(cfg, moe_layers) if any(moe_layers) else None)
    if not spec.mixers:
        return spec
    heads, head_dim = cfg.get("mamba_num_heads", 128), cfg.get("mamba_head_dim", 64)
    mamba = Mamba2Spec(num_heads=heads, head_dim=head_dim, state_size=cfg.get("ssm_state_size", 128),
                       num_groups=cfg.get("n_groups", cfg.get("mamba_n_groups", 8)), intermediate_size=heads * head_dim,
                       conv_kernel=cfg.get("conv_kernel", cfg.get("mamba_d_conv", 4)),
                       chunk_size=cfg.get("chunk_size", cfg.get("mamba_chunk_size", 128)),
                       conv_bias=bool(cfg.get("use_conv_bias", cfg.get("mamba_conv_bias", True))),
                       proj_bias=bool(cfg.get("use_bias", False)), norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
                       time_step_limit=(float(cfg.get("time_step_min", cfg.get("mamba_dt_min", 0.001))), float("inf")))
    return hybrid_spec(spec, mamba)


MODEL = Mamba2Decoder
