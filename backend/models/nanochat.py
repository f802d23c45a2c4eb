"""nanochat (`nanochat`: Karpathy's nanochat, d20 / d32): Llama's block with norms that have no weight
(x / rms(x), before attention, before the MLP, at the end), a plain MLP with the squared ReLU (`fc1`,
`fc2`), per-head norms of q and k (again without a weight) after the rotary, the logits soft-capped
(`final_logit_softcapping`, 15), and two differences made at load, where they cost nothing:

- the token embeddings are normalised before the first layer, so the residual stream starts from
  norm(embedding): a function of the token alone, so the table's rows are normalised once (the output
  head, where tied, keeps the rows as they were);
- the rotary turns each pair (x_i, x_{i + d/2}) the other way (its rotate_half is (x2, -x1)): the
  rotation by -angle of (a, b) is the rotation by +angle of (b, a), so swapping the halves of each
  query and key head (their rows of q_proj and k_proj) makes Llama's rotary the same; q . k and the
  per-head norms do not change under the same permutation of both.

The norms' missing weights are ones."""
import torch

from tritonformer.backend.models.transformer import (DecoderSpec, TransformerDecoder, WeightNames, plain_activation,
                                                     spec_from_hf)

NAMES = WeightNames(up="mlp.fc1", down="mlp.fc2")


def _halves_swapped(t: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """A q or k projection's rows (weight or bias) with the two halves of each head's dims exchanged."""
    t = t[:]
    return t.reshape(heads, 2, head_dim // 2, *t.shape[1:]).flip(1).reshape(t.shape)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    hidden, heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    kv_heads, head_dim = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or hidden // heads
    ones = {NAMES.final_norm: torch.ones(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        ones.update({p + NAMES.attn_norm + ".weight": torch.ones(hidden), p + NAMES.mlp_norm + ".weight":
                     torch.ones(hidden), p + NAMES.q_norm + ".weight": torch.ones(head_dim),
                     p + NAMES.k_norm + ".weight": torch.ones(head_dim)})
    state = {**ones, **state}
    for i in range(layers):
        for name, n in ((NAMES.q, heads), (NAMES.k, kv_heads)):
            for part in (".weight", ".bias"):
                if f"layers.{i}.{name}{part}" in state:
                    state[f"layers.{i}.{name}{part}"] = _halves_swapped(state[f"layers.{i}.{name}{part}"], n, head_dim)
    if NAMES.embed in state:
        embed = state[NAMES.embed][:]
        if cfg.get("tie_word_embeddings", False):
            state.setdefault(NAMES.lm_head, embed)
        rows = embed.float()
        eps = cfg.get("rms_norm_eps", 1e-6)
        state[NAMES.embed] = (rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps)).to(embed.dtype)
    return {**cfg, "tie_word_embeddings": False}, state


def from_hf(cfg: dict) -> DecoderSpec:
    bias = bool(cfg.get("attention_bias", False))
    return spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-6), gated_mlp=False,
                        activation=plain_activation(cfg, "nanochat", ("relu2",)), qkv_bias=bias, o_bias=bias,
                        qk_norm=True, qk_norm_after_rope=True, final_softcap=cfg.get("final_logit_softcapping"),
                        names=NAMES)


MODEL = TransformerDecoder
