"""HyperCLOVA X (`hyperclovax`: NAVER's HyperCLOVAX-SEED-Think-14B): Granite's block and muP scalars
(granite.py) with, where `use_post_norm` (the default), a second RMSNorm after attention and after the
MLP (Peri-LN: Gemma 2's sandwich norms, `post_norm1` / `post_norm2`) whose output is then times
`residual_multiplier` before the residual add. Two of Granite's readings differ: the logits are
multiplied by `logits_scaling`, not divided, and a config without `attention_multiplier` scales queries
by head_dim^-1/2, not 1.

Granite folds `residual_multiplier` into the output and down projections; behind a post norm that would
be normalised away, so there it is folded into the post norms' weights instead (at load: the norm's
output times w times r is the norm's output times (w * r))."""
from dataclasses import replace

from tritonformer.backend.models import granite
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames

NAMES = WeightNames(attn_post_norm="post_norm1", mlp_post_norm="post_norm2")


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """With post norms, their weights times `residual_multiplier`."""
    scale = float(cfg.get("residual_multiplier", 1.0))
    if not cfg.get("use_post_norm", True) or scale == 1.0:
        return cfg, state
    state = dict(state)
    for i in range(cfg["num_hidden_layers"]):
        for norm in (NAMES.attn_post_norm, NAMES.mlp_post_norm):
            name = f"layers.{i}.{norm}.weight"
            if name in state:
                state[name] = state[name][:] * scale
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if cfg.get("attention_multiplier") is None:
        cfg = {**cfg, "attention_multiplier": head_dim ** -0.5}
    post_norms = bool(cfg.get("use_post_norm", True))
    spec = granite.from_hf(cfg, **(dict(sandwich_norms=True, names=NAMES) if post_norms else {}))
    return replace(spec, logit_scale=float(cfg.get("logits_scaling", 1.0)),
                   residual_scale=None if post_norms else spec.residual_scale)


MODEL = TransformerDecoder
