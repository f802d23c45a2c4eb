"""CodeGen (`codegen`: Salesforce's CodeGen-350M to 16B, mono / multi / nl): GPT-J's block (attention and a
plain GELU MLP side by side on one LayerNorm with a bias, a rotary over the first `rotary_dim` dims of each
head pairing neighbouring dims, an output head with a bias; GPT-2's config names and `h.{i}` layers), its
Q, K and V in one `qkv_proj` laid out for four model-parallel shards: the rows are four blocks, each the
query, value and key rows (in that order) of a quarter of the heads. That layout is undone at load: the
rows split into GPT-J's `q_proj` / `k_proj` / `v_proj`, so the decoder reads CodeGen as GPT-J. Without
`rotary_dim` every dim of a head rotates."""
from tritonformer.backend.models import gpt_bigcode, gptj
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder

SHARDS = 4  # (the model-parallel shards of CodeGen's training, fixed in its fused projection's layout)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    cfg, state = gptj.adapt(cfg, state)
    state = dict(state)
    for i in range(gpt_bigcode.with_canonical_names(cfg)["num_hidden_layers"]):
        name = f"layers.{i}.attn.qkv_proj.weight"
        if name not in state:
            continue
        fused = state.pop(name)[:]
        rows, hidden = fused.shape
        if rows % (3 * SHARDS):
            raise ValueError(f"CodeGen's {name} has {rows} rows, not three projections over {SHARDS} shards")
        parts = fused.view(SHARDS, 3, rows // (3 * SHARDS), hidden)  # per shard: its heads' q, v, k
        for j, projection in enumerate((gptj.NAMES.q, gptj.NAMES.v, gptj.NAMES.k)):
            state[f"layers.{i}.{projection}.weight"] = parts[:, j].reshape(rows // 3, hidden)
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    named = gpt_bigcode.with_canonical_names(cfg)
    if named["num_attention_heads"] % SHARDS:
        raise ValueError(f"CodeGen with {named['num_attention_heads']} heads is not supported (supported: "
                         f"num_attention_heads a multiple of {SHARDS}, its fused projection's shards)")
    head_dim = named["hidden_size"] // named["num_attention_heads"]
    return gptj.from_hf({**cfg, "rotary_dim": cfg.get("rotary_dim") or head_dim})


MODEL = TransformerDecoder
