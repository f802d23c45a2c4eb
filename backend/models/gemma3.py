"""Gemma 3 (text): Gemma 2's block with per-head (1 + w) RMSNorms on q and k instead of
attention soft-capping, five sliding-window layers per global one (`sliding_window_pattern`),
and a rotary base of its own for the local layers (`rope_local_base_freq`)."""
from tritonformer.backend.models.gemma2 import gemma_options
from tritonformer.backend.models.multimodal import text_part
from tritonformer.backend.models.rope import Rope, params_by_layer_type
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, layer_windows, sliding_pattern,
                                                     spec_from_hf)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A multimodal Gemma 3 checkpoint (model_type gemma3): its text model's config and tensors."""
    if cfg.get("model_type") != "gemma3":
        return cfg, state
    return text_part(cfg, state, "gemma3_text")


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 with bidirectional attention (an embedding model) is not a generator")
    cfg = {"head_dim": 256, **cfg}
    max_positions = cfg.get("max_position_embeddings", 131072)
    full, local = params_by_layer_type(cfg)
    rope = Rope.from_hf(full, cfg.get("rope_theta", full.get("rope_theta", 1_000_000.0)), max_positions)
    local_rope = Rope.from_hf(local, cfg.get("rope_local_base_freq", local.get("rope_theta", 10_000.0)), max_positions)
    return spec_from_hf(
        {**cfg, "rope_parameters": None, "rope_scaling": None}, tie_default=True, **gemma_options(cfg),
        qk_norm=True, rope=rope, local_rope=None if local_rope == rope else local_rope,
        attn_softcap=cfg.get("attn_logit_softcapping"), final_softcap=cfg.get("final_logit_softcapping"),
        layer_windows=layer_windows(cfg, cfg.get("sliding_window", 4096), sliding_pattern(cfg, 6)),
    )


MODEL = TransformerDecoder
