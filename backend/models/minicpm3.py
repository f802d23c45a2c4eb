"""MiniCPM3 (`minicpm3`: MiniCPM3-4B): Llama's block with DeepSeek-V2's multi-head latent attention and muP's
scalars.

- Attention (mla.py): queries through a latent of `q_lora_rank` (or q_proj), keys and values from one of
  `kv_lora_rank` plus a shared rotary key of `qk_rope_head_dim` dims, the rotary over the rope dims in Llama's
  rotate-half form (dims i, i + rope / 2; not DeepSeek-V2's interleaved one), scores times
  (qk_nope_head_dim + qk_rope_head_dim) ** -0.5. Value heads are `v_head_dim` wide (hidden / heads by default).
  transformers' head_dim is qk_rope_head_dim, the dims the rotary turns: a `partial_rotary_factor` below 1 would
  turn fewer of them and is refused by name.
- Rope: the published longrope (per-frequency short / long factors over the rope dims; its original length is
  max_position_embeddings, so only the short factors apply) or any rope.py table.
- muP: token embeddings times `scale_emb` (DecoderSpec.embed_scale); attention's and the MLP's outputs times
  scale_depth / sqrt(num_hidden_layers) before each residual add (residual_scale: folded into o_proj and
  down_proj, and o_proj's bias, at load); the final hidden rows divided by hidden_size / dim_model_base before the
  head (logit_scale: folded into the final norm). scale_depth and dim_model_base null: no scaling, as
  transformers reads them.
- A dense gated MLP in every layer (`mlp_bias` honoured); the head tied to the embeddings by default."""
import math

from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, rope_parameters, spec_from_hf

# transformers' MiniCPM3Config defaults, where a config.json leaves them out
DEFAULTS = {"vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
            "num_attention_heads": 40, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "kv_lora_rank": 256,
            "q_lora_rank": 768, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "scale_emb": 12, "scale_depth": 1.4,
            "dim_model_base": 256, "attention_bias": False, "mlp_bias": False}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg, "rope_interleave": False}
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    if cfg.get("v_head_dim") is None:
        cfg["v_head_dim"] = hidden // cfg["num_attention_heads"]
    partial = (rope_parameters(cfg) or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"MiniCPM3 with partial_rotary_factor {partial} is not supported (supported: "
                         f"partial_rotary_factor 1.0: the rotary turns all qk_rope_head_dim dims)")
    cfg["head_dim"] = cfg["qk_rope_head_dim"]  # (transformers': the rotary's dims)
    depth = cfg["scale_depth"] if cfg["scale_depth"] is not None else math.sqrt(layers)
    base = cfg["dim_model_base"] if cfg["dim_model_base"] is not None else hidden
    return spec_from_hf(cfg, tie_default=True, **mla_options(cfg), embed_scale=float(cfg["scale_emb"]),
                        residual_scale=depth / math.sqrt(layers), logit_scale=base / hidden)


MODEL = TransformerDecoder
