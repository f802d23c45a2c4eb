"""DeepSeek-V3.2 (`deepseek_v32`: DeepSeek-V3.2-Exp, DeepSeek-V3.2) and the families built the same way (GLM-5,
glm_moe_dsa.py): DeepSeek-V3's block (deepseek_v3.py) with DeepSeek Sparse Attention (DSA), served up to
`index_topk` tokens a sequence, where DSA is dense latent attention.

- Attention: multi-head latent attention (mla.py): queries through a latent of `q_lora_rank` (transformers builds
  no q_proj form for these: q_lora_rank null is refused), keys and values from one of `kv_lora_rank` plus a shared
  rotary key of `qk_rope_head_dim` dims, the rotary always on interleaved pairs (transformers' model does not read
  `rope_interleave`: a config that sets it false is refused by name), scores times qk_head_dim ** -0.5 (times
  mscale ** 2 under YaRN with `mscale_all_dim`, mla.softmax_scale).
- DSA: a lightning indexer (`self_attn.indexer`: wq_b from the query latent, wk with a LayerNorm, weights_proj)
  scores every earlier key of a query (ReLU'd per-head dot products, weighted and summed) and the query attends to
  its `index_topk` best keys only, the others masked out. A query at position p has p + 1 causal keys: while
  p + 1 <= index_topk the top-k takes all of them (the masked ones score -inf, last), so the attention is the
  dense causal attention of DeepSeek-V3, whatever the indexer scores. So the longest sequence served (the spec's
  max_position_embeddings) is capped at index_topk (2,048 published), and a max_model_len past it is refused by
  name (DsaSpec.check_max_model_len): longer sequences would need the indexer, which is not implemented. The
  indexer's tensors are read-checked at load (present, at the config's shapes) but not used.
- Experts from `first_k_dense_replace` on (or where `mlp_layer_types` says "sparse"): sigmoid scores from fp32
  router logits, the top `num_experts_per_tok` by score plus `e_score_correction_bias` among the best `topk_group`
  of `n_group` groups (a group ranked by its two best), renormalised (`norm_topk_prob`) and scaled by
  `routed_scaling_factor`, `n_shared_experts` shared experts added as they are (glm4_moe.sigmoid_moe).
- The multi-token-prediction layer (`layers.{num_hidden_layers}`) is not read. DeepSeek's published weights are
  block-scaled FP8: refused at load (as DeepSeek-V3's)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tritonformer.backend.models.glm4_moe import sigmoid_moe
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

# transformers' DeepseekV32Config defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 3,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "n_routed_experts": 256,
            "moe_intermediate_size": 2048, "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
            "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}
INDEXER = "self_attn.indexer."


@dataclass(frozen=True)
class DsaSpec(DecoderSpec):
    """DecoderSpec plus the sparse attention's indexer: its top-k (the longest sequence served), its sizes and the
    layers that have one (GLM-5's "shared" layers reuse an earlier layer's choice and have none)."""

    family: str = "DeepSeek-V3.2"
    index_topk: int = 2048
    index_heads: int = 64
    index_head_dim: int = 128
    indexer_layers: tuple[bool, ...] = ()

    def check_max_model_len(self, max_model_len: int) -> None:
        """decoder.load_decoder's check of a max_model_len asked for: none past index_topk."""
        if max_model_len > self.index_topk:
            raise ValueError(
                f"{self.family} with max_model_len {max_model_len} is not supported (supported: max_model_len up to "
                f"index_topk, {self.index_topk}: its sparse attention is served as dense latent attention, the same "
                f"only while a sequence is at most index_topk tokens; longer ones need the indexer)")

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The indexers' tensors (client/model_shapes.tensor_shapes), which the load checks and does not use."""
        shapes = {}
        for i, has in enumerate(self.indexer_layers):
            if has:
                shapes.update({f"layers.{i}.{INDEXER}{name}": shape for name, shape in self.indexer_shapes().items()})
        return shapes

    def indexer_shapes(self) -> dict[str, tuple[int, ...]]:
        """One layer's indexer tensors by name (after `self_attn.indexer.`)."""
        width, hidden = self.index_heads * self.index_head_dim, self.hidden_size
        return {"wq_b.weight": (width, self.mla.q_lora_rank), "wk.weight": (self.index_head_dim, hidden),
                "k_norm.weight": (self.index_head_dim,), "k_norm.bias": (self.index_head_dim,),
                "weights_proj.weight": (self.index_heads, hidden)}


def dsa_spec(cfg: dict, family: str, indexer_layers: tuple[bool, ...]) -> DsaSpec:
    """The DsaSpec of a DSA config (its defaults filled in): latent attention, sigmoid experts, the longest sequence
    capped at index_topk; `family` names it in errors, `indexer_layers` says which layers hold an indexer."""
    if cfg.get("q_lora_rank") is None:
        raise ValueError(f"{family} with q_lora_rank null is not supported (supported: q_lora_rank, a query latent: "
                         f"transformers builds q_a_proj / q_b_proj only)")
    if not cfg.get("rope_interleave", True):
        raise ValueError(f"{family} with rope_interleave {cfg['rope_interleave']} is not supported (supported: "
                         f"rope_interleave true: transformers' model rotates interleaved pairs whatever it says)")
    topk, rope = int(cfg["index_topk"]), cfg["qk_rope_head_dim"]
    if topk < 2 or cfg["index_head_dim"] < rope:
        raise ValueError(f"{family} with index_topk {topk} / index_head_dim {cfg['index_head_dim']} is not supported "
                         f"(supported: index_topk at least 2, index_head_dim at least qk_rope_head_dim {rope})")
    layers = cfg["num_hidden_layers"]
    types = cfg.get("mlp_layer_types")
    if types is not None and (len(types) != layers or not set(types) <= {"dense", "sparse"}):
        raise ValueError(f"{family} with mlp_layer_types {types} is not supported (supported: mlp_layer_types, "
                         f"'dense' or 'sparse' for each of {layers} layers)")
    moe = sigmoid_moe(cfg, first_moe=3)
    if types is not None:
        moe = replace(moe, layers=tuple(t == "sparse" for t in types))
    spec = spec_from_hf({**cfg, "rope_interleave": True}, **mla_options({**cfg, "rope_interleave": True}), moe=moe)
    options = {f.name: getattr(spec, f.name) for f in fields(spec)}
    options["max_position_embeddings"] = min(spec.max_position_embeddings, topk)  # (the rope built as published)
    return DsaSpec(**options, family=family, index_topk=topk, index_heads=cfg["index_n_heads"],
                   index_head_dim=cfg["index_head_dim"], indexer_layers=indexer_layers)


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    return dsa_spec(cfg, "DeepSeek-V3.2", (True,) * cfg["num_hidden_layers"])


class DsaDecoder(TransformerDecoder):
    """The shared decoder (latent attention, experts) with the indexers' tensors checked at load, not kept."""

    def __init__(self, config: DsaSpec, state: dict, device, dtype, tp=None):
        sizes = f"hidden {config.hidden_size}, index_n_heads {config.index_heads} x {config.index_head_dim}"
        for i, has in enumerate(config.indexer_layers):
            for name, shape in config.indexer_shapes().items() if has else ():
                self.checked(state, f"layers.{i}.{INDEXER}{name}", shape, sizes)
        super().__init__(config, state, device, dtype, tp=tp)


MODEL = DsaDecoder
