"""Youtu-LLM (`youtu`: Youtu-LLM-2B): Llama's block with DeepSeek-V3's multi-head latent attention (mla.py:
queries through a latent of `q_lora_rank`, keys and values from one of `kv_lora_rank` plus a shared rotary key,
the rotary interleaved where `rope_interleave`) and a dense gated MLP in every layer; the head tied to the
embeddings by default."""
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

# transformers' YoutuConfig defaults, where a config.json leaves them out
DEFAULTS = {"rope_interleave": True, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128}


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    return spec_from_hf(cfg, tie_default=True, **mla_options(cfg))


MODEL = TransformerDecoder
