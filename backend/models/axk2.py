"""A.X-K2 (`axk2`: SK Telecom's A.X-K2, A.X-K2-Light): DeepSeek-V3.2's block (deepseek_v32.py: latent attention with
DeepSeek Sparse Attention, served up to `index_topk` tokens a sequence, 2,048 published, where it is dense latent
attention; a longer max_model_len refused by name) with three changes, all in pieces the shared decoder already has.

- Queries without q_b: the query latent c = q_a(x) (`q_lora_rank`) and its RMSNorm N(c) (`q_a_layernorm`, the one
  the indexer reads) go side by side into one projection, `q_gate_proj` [N(c); c] -> per head [q (nope, rope);
  g (`v_head_dim`)]. Its query rows are what mla.py's q_b would be (two q_lora_rank columns a row); its gate rows
  gate the attention's output per element before o_proj: o * sigmoid(g) (g in fp32, the product rounded once).
  Keys and values from the latent as DeepSeek-V3's, the rotary always interleaved.
- Gated RMSNorms: `input_layernorm` (every layer) and, in the expert layers only, `post_attention_layernorm` are
  y = RMSNorm(x); y * sigmoid(fc2(silu(fc1(y)))) (a CLIP-style MLP, `gated_norm_rank` wide, no biases; the
  sigmoid of its fp32 output, the product rounded once). The dense layers' post-attention norm is a plain RMSNorm.
  The RMSNorm is the shared decoder's (fused with the residual add); the gate runs on its output, before the
  latent projections (GatedMlaLayer) or the router (GatedInputMoe).
- Experts where `mlp_layer_types` says "sparse" (without it: from `first_k_dense_replace`, 1, on), DeepSeek-V3's
  sigmoid routing with `e_score_correction_bias`; A.X-K2-Light's `n_group` null routes over all experts
  (`n_group` without `topk_group`, or the other way round, refused by name, as transformers refuses it).
  The dense MLP is a SwiGLU.

The released checkpoints' names load too (the gate MLPs' `W_down` / `W_up`, q_gate_proj as `self_attn.q_b_proj`, the
experts one by one). The indexers' tensors are read-checked at load and not used (deepseek_v32.py); the MTP layers
are not read."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from tritonformer import kernels
from tritonformer.backend.models.axk1 import mlp_layers
from tritonformer.backend.models.deepseek_v32 import DsaDecoder, DsaSpec, dsa_spec
from tritonformer.backend.models.mla import MlaLayer, load_mla_layer
from tritonformer.backend.models.transformer import DecoderSpec

# transformers' AXK2Config defaults, where a config.json leaves them out
DEFAULTS = {"n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
            "q_lora_rank": 384, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "v_head_dim": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 512, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 131072, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16,
            "gated_norm_rank": 16}
Q_GATE = "self_attn.q_gate_proj"
INPUT_NORM, MLP_NORM = "input_layernorm", "post_attention_layernorm"
# (the released checkpoints' names -> transformers')
PUBLISHED_NAMES = ((".W_down.", ".mlp.fc1."), (".W_up.", ".mlp.fc2."), (".self_attn.q_b_proj.", f".{Q_GATE}."))


@dataclass(frozen=True)
class Axk2Spec(DsaSpec):
    """DeepSeek-V3.2's spec plus the gated norms' rank."""

    gated_norm_rank: int = 16

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...] | None]:
        """Beside the indexers': q_gate_proj in place of q_b, the gated norms' MLPs, the expert layers' norms under
        `.norm` (None: the plain name, which those layers do not hold)."""
        m, hidden, rank = self.mla, self.hidden_size, self.gated_norm_rank
        shapes = super().extra_tensor_shapes()
        gate = {"mlp.fc1.weight": (rank, hidden), "mlp.fc2.weight": (hidden, rank)}
        for i, experts in enumerate(self.moe.layers):
            p = f"layers.{i}."
            shapes[p + Q_GATE + ".weight"] = (self.num_heads * (m.qk_head_dim + m.v_head_dim), 2 * m.q_lora_rank)
            shapes.update({f"{p}{INPUT_NORM}.{name}": shape for name, shape in gate.items()})
            if experts:
                shapes.update({f"{p}{MLP_NORM}.{name}": shape for name, shape in gate.items()})
                shapes.update({f"{p}{MLP_NORM}.weight": None, f"{p}{MLP_NORM}.norm.weight": (hidden,)})
        return shapes


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {**DEFAULTS, **cfg}
    if (cfg.get("n_group") is None) != (cfg.get("topk_group") is None):
        raise ValueError(f"A.X-K2 with n_group {cfg.get('n_group')} / topk_group {cfg.get('topk_group')} is not "
                         f"supported (supported: n_group and topk_group both set, grouped routing, or both null, "
                         f"routing over all experts)")
    if cfg.get("mlp_layer_types") is None:  # (transformers' rule from the legacy names; a list: dsa_spec checks it)
        cfg["mlp_layer_types"] = ["sparse" if moe else "dense" for moe in mlp_layers(cfg)]
    spec = dsa_spec(cfg, "A.X-K2", (True,) * cfg["num_hidden_layers"])
    options = {f.name: getattr(spec, f.name) for f in fields(spec)}
    options["names"] = replace(spec.names, attn_norm=f"{INPUT_NORM}.norm")
    options["mla"] = replace(spec.mla, names=replace(spec.mla.names, q_b=Q_GATE))
    return Axk2Spec(**options, gated_norm_rank=cfg["gated_norm_rank"])


def norm_gated(y: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor) -> torch.Tensor:
    """A gated RMSNorm's gate on the norm's output rows y: y * sigmoid(fc2(silu(fc1(y)))), as transformers rounds."""
    g = kernels.linear_act(torch.nn.functional.silu(kernels.linear_act(y, fc1)), fc2)
    return (y.float() * torch.sigmoid(g.float())).to(y.dtype)


@dataclass
class GatedMlaLayer(MlaLayer):
    """mla.py's layer behind the gated input norm, its queries from [N(c); c] (q_b_w: q_gate_proj's query rows, in
    mla.py's order) and its output gated by q_gate_proj's gate rows."""

    gate_w: torch.Tensor | None = None  # [heads * v_head_dim, 2 * q_lora_rank]
    norm_fc1: torch.Tensor | None = None  # the input norm's gate MLP, [rank, hidden] and [hidden, rank]
    norm_fc2: torch.Tensor | None = None
    gate: torch.Tensor | None = None  # the last to_cache's output gate, [T, heads * v_head_dim] (values() reads it)

    def to_cache(self, x, prenorm, cos, sin, k_cache, v_cache, slot_mapping):
        """mla.MlaLayer.to_cache's, with the input norm's gate first and the queries (and output gate) from both
        halves of the query latent."""
        s = self.spec
        t, heads, d = x.shape[0], self.heads, s.qk_head_dim
        x = norm_gated(x if prenorm is None else kernels.prenormed(x, prenorm), self.norm_fc1, self.norm_fc2)
        a = kernels.linear_act(x, self.a_w, self.a_b)
        q_width = s.q_lora_rank
        q_latent, kv_latent = kernels.mla_latent_norms(a, q_width, self.q_norm, self.kv_norm, s.norm_eps)
        both = torch.cat([q_latent, a[:, :q_width]], dim=1)
        q = kernels.linear_act(both, self.q_b_w).view(t, heads, d)
        self.gate = kernels.linear_act(both, self.gate_w)
        return self.rotate_and_cache(q, kv_latent, a, cos, sin, k_cache, v_cache, slot_mapping)

    def values(self, ctx: torch.Tensor) -> torch.Tensor:
        """The heads' values gated: o * sigmoid(g), `[T, heads * v_head_dim]`."""
        v = ctx[:, :, : self.spec.v_head_dim].reshape(ctx.shape[0], -1)
        return (v.float() * torch.sigmoid(self.gate.float())).to(v.dtype)

    def params(self) -> int:
        return super().params() + sum(w.numel() for w in (self.gate_w, self.norm_fc1, self.norm_fc2))

    def read_bytes(self, tokens: int | None) -> int:
        return super().read_bytes(tokens) + sum(w.numel() * w.element_size()
                                                for w in (self.gate_w, self.norm_fc1, self.norm_fc2))


class GatedInputMoe:
    """An expert block behind the gated post-attention norm: the norm (the shared decoder's prenorm), its gate, then
    the block on the gated rows; everything else is the block's."""

    def __init__(self, moe, fc1: torch.Tensor, fc2: torch.Tensor):
        self.moe, self.norm_fc1, self.norm_fc2 = moe, fc1, fc2

    def __call__(self, x: torch.Tensor, activation: str, prenorm: kernels.PreNorm | None = None) -> torch.Tensor:
        x = norm_gated(x if prenorm is None else kernels.prenormed(x, prenorm), self.norm_fc1, self.norm_fc2)
        return self.moe(x, activation)

    def __getattr__(self, name):
        return getattr(self.__dict__["moe"], name)


def published_name(name: str) -> str:
    """A tensor's name as transformers names it: the released checkpoints' gate MLPs are `W_down` / `W_up`, their
    fused query and gate projection `self_attn.q_b_proj`."""
    for old, new in PUBLISHED_NAMES:
        name = name.replace(old, new)
    return name


class Axk2Decoder(DsaDecoder):
    """The shared decoder (latent attention, experts; the indexers checked) with A.X-K2's gated norms and gated
    query projection."""

    def __init__(self, config: Axk2Spec, state: dict, device, dtype, tp=None):
        state = {published_name(name): t for name, t in state.items()}
        for i, experts in enumerate(config.moe.layers):  # (the expert layers' RMSNorm under `.norm`)
            name = f"layers.{i}.{MLP_NORM}.norm.weight"
            if experts and name in state:
                state[f"layers.{i}.{MLP_NORM}.weight"] = state.pop(name)
        super().__init__(config, state, device, dtype, tp=tp)
        rank, hidden = config.gated_norm_rank, config.hidden_size
        sizes = f"hidden {hidden}, gated_norm_rank {rank}"
        for i, layer in enumerate(self.layers):
            if config.moe.layers[i]:
                p = f"layers.{i}.{MLP_NORM}.mlp."
                layer.moe = GatedInputMoe(
                    layer.moe, self.weight(self.checked(state, p + "fc1.weight", (rank, hidden), sizes)),
                    self.weight(self.checked(state, p + "fc2.weight", (hidden, rank), sizes)))

    def load_mla(self, prefix: str, read, part: slice | None) -> MlaLayer:
        """mla.load_mla_layer's with q_gate_proj's query rows as q_b (its gate rows kept beside them) and the input
        norm's gate MLP."""
        c = self.config
        m, heads = c.mla, c.num_heads
        d, v, q_rank = m.qk_head_dim, m.v_head_dim, m.q_lora_rank
        part = part or slice(0, heads)
        local = part.stop - part.start
        rows = read(prefix + Q_GATE + ".weight", (heads * (d + v), 2 * q_rank),
                    (slice(part.start * (d + v), part.stop * (d + v)),)).reshape(local, d + v, 2 * q_rank)

        def with_queries(name: str, shape: tuple[int, ...], index: tuple | None = None) -> torch.Tensor:
            if name == prefix + Q_GATE + ".weight":  # (load_mla_layer's q_b: this rank's query rows)
                return rows[:, :d].reshape(local * d, 2 * q_rank)
            return read(name, shape, index)

        base = load_mla_layer(m, with_queries, prefix, c.hidden_size, heads, part)
        rank, hidden = c.gated_norm_rank, c.hidden_size
        norm = prefix + INPUT_NORM + ".mlp."
        return GatedMlaLayer(**{f.name: getattr(base, f.name) for f in fields(base)},
                             gate_w=rows[:, d:].reshape(local * v, 2 * q_rank).contiguous(),
                             norm_fc1=read(norm + "fc1.weight", (rank, hidden)),
                             norm_fc2=read(norm + "fc2.weight", (hidden, rank)))


MODEL = Axk2Decoder
