"""Granite SWA (`granite_swa`: IBM's granite-swash-2b; `granitemoe_swa`: granite-swash-3b-a600m): Granite's
block and muP scalars (granite.py; the MoE one Granite MoE's experts, granitemoe.py) with three changes:
sliding-window attention (`sliding_window`, 128) on the layers `layer_types` names, by default all but
every fourth from the first (0, 4, ...); a learnt sink logit per query head in each layer's softmax
(transformers scales the attention output by sigmoid(logsumexp(scores) - sink), which is
exp(lse) / (exp(lse) + exp(sink)): the sink as one more logit in the denominator, gpt-oss's `sinks`);
and a rope base per layer (`layer_rope_theta`, 0 for a layer without rotary). The decoder has one rope
table for the global layers and one for the windowed ones, so a config whose rotating global layers
(or windowed ones) use more than one base is refused."""
from tritonformer.backend.models import granite, granitemoe
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, rope_parameters


def swa_options(cfg: dict) -> dict:
    """The DecoderSpec fields of the windows, the sinks and the per-layer rope bases."""
    layers = cfg["num_hidden_layers"]
    params = dict(rope_parameters(cfg) or {})
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    windows = layer_windows(cfg, cfg.get("sliding_window", 128), [i % 4 != 0 for i in range(layers)])
    thetas = cfg.get("layer_rope_theta") or [theta] * layers
    if len(thetas) != layers:
        raise ValueError(f"layer_rope_theta must give one rope base for each of {layers} layers")
    local = [bool(windows) and windows[i] is not None for i in range(layers)]
    bases = {kind: {t for t, is_local in zip(thetas, local) if t and is_local == (kind == "local")}
             for kind in ("global", "local")}
    for kind, found in bases.items():
        if len(found) > 1:
            raise ValueError(f"Granite SWA with {kind} layers of different rope bases (layer_rope_theta "
                             f"{sorted(found)}) is not supported (supported: layer_rope_theta with one base for the "
                             f"global layers and one for the windowed ones, 0 for a layer without rotary)")
    positions = cfg.get("max_position_embeddings", 2048)
    rope = Rope.from_hf({**params, "rope_theta": next(iter(bases["global"]), theta)}, theta, positions)
    local_rope = Rope.from_hf({**params, "rope_theta": next(iter(bases["local"]), theta)}, theta, positions)
    return dict(layer_windows=windows, sinks=True, rope=rope, local_rope=None if local_rope == rope else local_rope,
                rope_layers=tuple(bool(t) for t in thetas) if not all(thetas) else ())


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("model_type") == "granitemoe_swa":
        return granitemoe.from_hf(cfg, **swa_options(cfg))
    return granite.from_hf(cfg, **swa_options(cfg))


MODEL = TransformerDecoder
