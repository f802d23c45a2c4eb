"""Granite 4.0-H (`granitemoehybrid`: IBM's granite-4.0-h-tiny, -small, -micro; and the dense
granite-4.0-micro, every layer attending): Granite's pre-norm block and four muP scalars (granite.py)
where most layers run Mamba-2 (mamba2.py) in place of attention, as `layer_types` lists them ("mamba" /
"attention", or transformers' "linear_attention" / "full_attention"). The residual multiplier scales the
Mamba layers' output projections too. Attention rotates q and k only where `position_embedding_type` is
"rope" (the published models are NoPE). The MLP: experts routed as Granite MoE routes them (the top k
logits' softmax, granitemoe.py) plus the shared MLP (`shared_mlp`: [gate; up] `input_linear`, then
`output_linear`) added, or with `num_local_experts` 0 the shared MLP alone."""
from tritonformer.backend.models import granite, granitemoe
from tritonformer.backend.models.mamba2 import Mamba2Decoder, Mamba2Spec, hybrid_spec, layer_mixers
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames

DENSE_NAMES = WeightNames(gate_up="shared_mlp.input_linear", down="shared_mlp.output_linear")


def from_hf(cfg: dict) -> DecoderSpec:
    layers = cfg["num_hidden_layers"]
    kinds = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * layers
    if len(kinds) != layers:
        raise ValueError(f"Granite 4.0-H lists {len(kinds)} layer_types for {layers} layers")
    mixers = layer_mixers(kinds, "Granite 4.0-H")
    position = cfg.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise ValueError(f"Granite 4.0-H position_embedding_type {position!r} is not supported "
                         f"(supported: rope, nope / none)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Granite 4.0-H hidden_act {cfg['hidden_act']!r} (supported: silu)")
    options = dict(mixers=mixers if any(mixers) else (), norm_eps=cfg.get("rms_norm_eps", 1e-6),
                   rope_layers=() if position == "rope" else (False,) * layers)
    if cfg.get("num_local_experts", 0) > 0:
        spec = granitemoe.from_hf(cfg, **options)
    else:  # the shared MLP is the layer's MLP
        spec = granite.from_hf({**cfg, "intermediate_size": cfg["shared_intermediate_size"]}, names=DENSE_NAMES,
                               **options)
    if not spec.mixers:  # (every layer attends: granite-4.0-micro)
        return spec
    return hybrid_spec(spec, Mamba2Spec.from_hf({"rms_norm_eps": 1e-6, **cfg}, "Granite 4.0-H"))


MODEL = Mamba2Decoder
