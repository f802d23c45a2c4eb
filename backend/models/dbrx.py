"""DBRX (Databricks' DBRX Base / Instruct, 132B with 36B active; `model_type` dbrx): LayerNorms
without a bias, a fused QKV projection (`Wqkv`: the query heads' rows, then the key heads', then
the value heads') whose outputs are clamped to [-clip_qkv, clip_qkv] before the rotary (8 in the
published config), and experts in every layer: softmax over 16 experts' logits, the top 4 of
them, their probabilities divided by their p-norm (`moe_normalize_expert_weights`: p = 1, the L1
norm, renormalises them to sum to 1; null leaves them as they are; other p refused), each expert a
SwiGLU MLP (`ffn_act_fn` silu; others refused).

The config nests its options (`attn_config`, `ffn_config`) under names of its own (`d_model`,
`n_heads`, `n_layers`, `max_seq_len`): `adapt` lifts them to the names the shared decoder reads.
The rotary base: a config transformers >= 5 wrote carries it in its top-level `rope_parameters`,
which is what transformers' model rotates by; the published config.json in `attn_config.rope_theta`
(500,000), read where there is no `rope_parameters`.

The experts are stored as three tensors `[E * I, H]` per layer, `ffn.experts.mlp.w1` (gate), `v1`
(up) and `w2` (down, stored transposed: each expert's `[I, H]` is the x @ W of its down projection).
`adapt` puts lazy views of them where moe.py reads stacked experts (`[E, 2I, H]` [gate; up] and
`[E, H, I]`): a read makes only the rows asked for (a tensor-parallel rank's columns of each expert),
from the checkpoint's tensors, lazy or not."""
from __future__ import annotations

import torch

from tritonformer.backend.models.moe import MoeNames, MoeSpec
from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, config_renamed,
                                                     layers_renamed, spec_from_hf)

NAMES = WeightNames(qkv="norm_attn_norm.attn.Wqkv", o="norm_attn_norm.attn.out_proj",
                    attn_norm="norm_attn_norm.norm_1", mlp_norm="norm_attn_norm.norm_2", embed="wte.weight",
                    final_norm="norm_f.weight")
GATE_UP, DOWN = "experts.gate_up", "experts.down"  # (the views adapt adds, under the block `ffn`)


class _StackedExperts:
    """Experts stored as `[E * I, H]` tensors read as moe.py's stacked layout: `gate_up` `[E, 2I, H]`
    (each expert's rows of `parts[0]`, then of `parts[1]`) or `down` `[E, H, I]` (each expert's rows of
    `parts[0]` transposed). Indexed as a tensor is (the experts all, then any rows / columns), or read
    whole by `to`."""

    def __init__(self, parts: tuple, experts: int, inter: int, down: bool):
        self.parts, self.experts, self.inter, self.down = parts, experts, inter, down
        hidden = parts[0].shape[1]
        self.shape = (experts, hidden, inter) if down else (experts, 2 * inter, hidden)

    def __getitem__(self, index) -> torch.Tensor:
        index = (index if isinstance(index, tuple) else (index,)) + (slice(None),) * 3
        if index[0] != slice(None):
            raise IndexError(f"stacked DBRX experts are read for every expert, not {index[0]!r}")
        stored = index[2] if self.down else index[1]  # (the index over each expert's stored rows)
        other = index[1] if self.down else index[2]
        lo, hi, step = stored.indices(self.shape[2] if self.down else self.shape[1])
        if step != 1:
            raise IndexError("stacked DBRX experts are read in ranges of rows")
        rows = []
        for e in range(self.experts):
            base, taken = e * self.inter, []
            for j, part in enumerate(self.parts):  # (gate_up: rows [0, I) from w1, [I, 2I) from v1)
                start, stop = max(lo, j * self.inter), min(hi, (j + 1) * self.inter)
                if start < stop:
                    taken.append(part[base + start - j * self.inter: base + stop - j * self.inter])
            block = torch.cat(taken) if taken else self.parts[0][base:base]
            rows.append(block.t()[other] if self.down else block[:, other])
        return torch.stack(rows)

    def to(self, device=None, dtype=None, **kwargs) -> torch.Tensor:
        return self[:].to(device=device, dtype=dtype)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The config under the shared decoder's names, the layers as `layers.{i}.` and each layer's
    experts as stacked views (see the module's docstring)."""
    cfg = config_renamed(cfg, (("d_model", "hidden_size"), ("n_heads", "num_attention_heads"),
                               ("n_layers", "num_hidden_layers"), ("max_seq_len", "max_position_embeddings")))
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    # (the nested options win, as transformers reads them: no dense MLP, so no other intermediate_size)
    cfg.update(num_key_value_heads=attn.get("kv_n_heads", 1), intermediate_size=ffn.get("ffn_hidden_size", 3584),
               num_experts=ffn.get("moe_num_experts", 4), num_experts_per_tok=ffn.get("moe_top_k", 1))
    if not cfg.get("rope_parameters") and not cfg.get("rope_scaling"):  # (the published config.json)
        cfg["rope_theta"] = attn.get("rope_theta", 10000.0)
    state = dict(layers_renamed(state, "blocks."))
    experts, inter = cfg["num_experts"], cfg["intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}.ffn.experts.mlp."
        if p + "w1" not in state:
            continue
        state[f"layers.{i}.ffn.{GATE_UP}"] = _StackedExperts((state[p + "w1"], state[p + "v1"]), experts, inter, False)
        state[f"layers.{i}.ffn.{DOWN}"] = _StackedExperts((state[p + "w2"],), experts, inter, True)
    return cfg, state


def from_hf(cfg: dict) -> DecoderSpec:
    if "d_model" in cfg and "hidden_size" not in cfg:
        cfg = adapt(cfg, {})[0]
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    act = (ffn.get("ffn_act_fn") or {}).get("name", "silu")
    if act != "silu":
        raise ValueError(f"DBRX with ffn_act_fn {act!r} is not supported (supported: ffn_act_fn silu)")
    p = ffn.get("moe_normalize_expert_weights", 1.0)
    if p not in (None, 1, 1.0):
        raise ValueError(f"DBRX with moe_normalize_expert_weights {p} is not supported (supported: "
                         f"moe_normalize_expert_weights 1 or null)")
    moe = MoeSpec(num_experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                  intermediate_size=cfg["intermediate_size"], normalize=p is not None, round_weights=True,
                  layers=(True,) * cfg["num_hidden_layers"],
                  names=MoeNames(blocks=("ffn",), routers=("router.layer",), stacked=((GATE_UP, DOWN),)))
    clip = attn.get("clip_qkv")
    return spec_from_hf(cfg, norm_eps=1e-5, layer_norm=True, moe=moe, names=NAMES,
                        clip_qkv=None if clip is None else float(clip))


MODEL = TransformerDecoder
