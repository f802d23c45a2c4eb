"""GLM-5 (`glm_moe_dsa`: GLM-5, GLM-5.1): DeepSeek-V3.2's block (deepseek_v32.py: latent attention with DeepSeek
Sparse Attention, sigmoid experts with a choice bias from `first_k_dense_replace` on) at GLM's sizes, served up to
`index_topk` tokens a sequence (2,048 published), where the sparse attention is dense latent attention; a
max_model_len past it is refused by name.

What GLM-5 changes is the indexer's only, which the dense form does not run: its rotary on interleaved pairs
(DeepSeek-V3.2's rotates halves), and `indexer_types` ("full": the layer runs its own indexer; "shared": it reuses
the previous full layer's top-k and holds no indexer tensors), else the pattern `index_topk_pattern` ("F" / "S"
per layer), else transformers' rule from `index_topk_freq` (1) and `index_skip_topk_offset` (2): layer i full
where max(i - offset + 1, 0) % freq == 0. Below index_topk every layer's top-k is all of its causal keys, so a
shared layer attends as a full one does; the kinds only say which layers' indexer tensors the load checks. The
first layer must be full (transformers fails on a shared one with no layer before it).

Mistral Large 4 (`mistral_large4`) builds on this block but is not served (not in the family table): queries from
q_proj, a rotary whose frequencies a checkpoint tensor scales (LeRoPE's `alpha`), learnt per-head query scales by
log(position + 1), NoPE layers and latent caches that later layers read (`kv_source_layers`) are not in the shared
decoder."""
from tritonformer.backend.models.deepseek_v32 import DsaDecoder, dsa_spec
from tritonformer.backend.models.transformer import DecoderSpec

# transformers' GlmMoeDsaConfig defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 3,
            "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
            "v_head_dim": 256, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8, "n_routed_experts": 256,
            "moe_intermediate_size": 2048, "rms_norm_eps": 1e-5, "max_position_embeddings": 202752,
            "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32}


def indexer_kinds(cfg: dict) -> tuple[str, ...]:
    """Per layer "full" or "shared" (see the module's docstring)."""
    layers = cfg["num_hidden_layers"]
    kinds = cfg.get("indexer_types")
    if kinds is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    if kinds is None:
        freq, offset = max(cfg.get("index_topk_freq", 1), 1), cfg.get("index_skip_topk_offset", 2)
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    kinds = tuple(kinds)
    if len(kinds) != layers or not set(kinds) <= {"full", "shared"} or kinds[0] != "full":
        raise ValueError(f"GLM-5 with indexer_types {list(kinds)} is not supported (supported: indexer_types, 'full' "
                         f"or 'shared' for each of {layers} layers, the first 'full')")
    return kinds


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    return dsa_spec(cfg, "GLM-5", tuple(kind == "full" for kind in indexer_kinds(cfg)))


MODEL = DsaDecoder
