"""Plain-PyTorch reference implementations of every op the runtime uses.

These define the semantics. A Triton-language kernel for an op must have the same signature
and match its reference on random inputs (see tests/test_kernels_reference.py). On a machine
without a GPU these are what actually runs.

Activations are packed: a batch of sequences of different lengths is one `[total_tokens, ...]`
tensor plus `cu_seqlens` (int32, cumulative lengths starting at 0), never a padded batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritonformer.kernels import fp8
from tritonformer.kernels.fp8 import Fp8Activation, Fp8Weight


def add_bias_residual_layer_norm(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
    fp8_out: Fp8Activation | None = None,
) -> torch.Tensor:
    """LayerNorm(x + bias + residual): BERT's post-attention / post-FFN block, statistics in fp32.
    `out` (optional) receives the result (an activation-arena view, say); `sum_out` (optional,
    not overlapping the inputs) receives x + bias + residual, a pre-norm decoder's next residual;
    `fp8_out` (optional, an Fp8Activation `[M, hidden]`) receives the result as rounded to x's
    dtype, quantised per token (`quantize_rows_fp8`): the operand of the next FP8 linear, which
    then skips its own quantisation pass (an encoder's QKV and FFN up projections)."""
    h = x.float()
    if bias is not None:
        h = h + bias.float()
    if residual is not None:
        h = h + residual.float()
    if sum_out is not None:
        sum_out.copy_(h)
    result = F.layer_norm(h, (h.shape[-1],), weight.float(), ln_bias.float(), eps).to(x.dtype)
    if fp8_out is not None:
        q, scale = quantize_rows_fp8(result.reshape(-1, result.shape[-1]))
        fp8_out.q.copy_(q)
        fp8_out.scale.copy_(scale)
    return result if out is None else out.copy_(result)


def embedding_layer_norm(
    ids: torch.Tensor,
    table: torch.Tensor,
    positions: torch.Tensor,
    position_table: torch.Tensor,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """An embedding layer: LayerNorm(table[ids] + bias + position_table[positions]), summed in
    fp32 (BERT passes its token-type row as the bias); `sum_out` receives the sum (GPT-2's
    residual stream). ids and positions are `[T]`; the result is `[T, hidden]`."""
    return add_bias_residual_layer_norm(table[ids], bias, position_table[positions], weight, ln_bias, eps, out, sum_out)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    sum_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm(x + residual) (Llama). Returns (normalised, x + residual) so the caller keeps
    the un-normalised sum as the next residual without a second pass; `sum_out` (optional, not
    overlapping the inputs) receives that sum and is what is returned; `out` (optional)
    receives the normalised rows likewise."""
    h = x.float() if residual is None else x.float() + residual.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    summed = h.to(x.dtype) if sum_out is None else sum_out.copy_(h)
    result = (normed * weight.float()).to(x.dtype)
    return (result if out is None else out.copy_(result)), summed


def segment_rms_norms(
    x: torch.Tensor, sizes: tuple[int, ...], eps: float, weight: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Each row of x `[T, sum(sizes)]` cut into segments of `sizes` columns, each segment RMS-normalised
    on its own (Mamba-1's dt, B and C in Falcon-Mamba and Jamba): in fp32, rounded to x's dtype, then,
    where `weight` (`[sum(sizes)]`, the segments' weights end to end) is given, times its part in x's
    dtype (one rounding). Returns one contiguous `[T, size]` tensor per segment."""
    out, start = [], 0
    for size in sizes:
        f = x[:, start : start + size].float()
        normed = (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        if weight is not None:
            normed = normed * weight[start : start + size]
        out.append(normed.contiguous())
        start += size
    return out


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none", out: torch.Tensor | None = None
) -> torch.Tensor:
    """GELU(x + bias); `approximate` is "none" (erf, BERT's "gelu") or "tanh" ("gelu_new").
    `out` may be x itself (in place)."""
    h = x.float() if bias is None else x.float() + bias.float()
    result = F.gelu(h, approximate=approximate).to(x.dtype)
    return result if out is None else out.copy_(result)


def feed_tokens(input_ids: torch.Tensor, last_ids: torch.Tensor) -> torch.Tensor:
    """In place on int64 `input_ids`: every negative id `-1 - r` becomes `last_ids[r]`.

    A decoder iteration is launched before the previous one's sampled tokens reach the host;
    its inputs name those tokens by their row in the previous iteration's samples, which stay
    on the device in `last_ids`. Non-negative ids are left as they are."""
    fed = input_ids < 0
    src = (-1 - input_ids).clamp_(min=0)
    input_ids.copy_(torch.where(fed, last_ids[src], input_ids))
    return input_ids


def advance_decode_inputs(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    seqlens: torch.Tensor,
    tables: torch.Tensor,
    steps_left: torch.Tensor,
    block_size: int,
    scratch_slot: int,
) -> None:
    """In place, at the end of a decode iteration: prepare the next one on the device.

    Each row with `steps_left > 0` moves on to its next token: position + 1, one key more, the
    cache slot of that position from its block table `[rows, width]` (int32), and as its token
    id the row's own sample, `-1 - row` (which `feed_tokens` resolves); `steps_left` counts one
    down. Every other row becomes padding: id 0, position 0, no keys, the scratch slot. int64
    ids, positions and slots; int32 key counts and steps."""
    go = steps_left > 0
    pos = torch.where(go, positions + 1, 0)
    block = tables.gather(1, (pos // block_size).view(-1, 1)).squeeze(1).long()
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    input_ids.copy_(torch.where(go, -1 - rows, 0))
    positions.copy_(pos)
    seqlens.copy_(torch.where(go, pos + 1, 0))
    slot_mapping.copy_(torch.where(go, block * block_size + pos % block_size, scratch_slot))
    steps_left.sub_(go.to(steps_left.dtype))


def argmax_rows(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Greedy samples: `out[r]` (int64) = the column of row r's largest logit, the first one
    on ties. `logits` `[rows, vocab]`, any float dtype; rows may be strided (a slice of a
    padded vocabulary projection). Returns `out`."""
    return torch.argmax(logits, dim=-1, out=out)


def apply_penalties(logits: torch.Tensor, output_counts: torch.Tensor, in_prompt: torch.Tensor, slots: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """Sampling penalties on fp32 `logits` `[S, V]`, in place; returns `logits`.

    Row r's sequence keeps its state in row `slots[r]` of two pools: `output_counts` `[rows, V]`
    int32 (how often each token was generated) and `in_prompt` `[rows, V]` bool. First Hugging
    Face's repetition penalty over prompt and generated tokens (a positive logit divided by
    `repetition[r]`, a negative one multiplied), then OpenAI's frequency and presence penalties
    over generated tokens: `logit -= frequency[r] * count + presence[r] * (count > 0)`. The
    order is vLLM's. A neutral row (1, 0, 0) is left as it was.
    """
    counts = output_counts.index_select(0, slots)
    generated = counts > 0
    seen = in_prompt.index_select(0, slots) | generated
    rep = repetition[:, None]
    penalized = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    penalized -= frequency[:, None] * counts.to(torch.float32) + presence[:, None] * generated.to(torch.float32)
    return logits.copy_(penalized)


POOLING_MODES = ("mean", "cls", "last")


def pool_sequences(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    """Sentence embeddings `[B, hidden]` fp32 from packed token states `[T, hidden]`: "mean"
    over each sequence's rows, "cls" (its first row) or "last" (its last row: a decoder
    embedder's, whose last token has attended to every other); with `normalize`, divided by
    max(L2 norm, 1e-12) as F.normalize does. An empty sequence gives a row of zeros."""
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling mode {mode!r}")
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if mode != "mean":
        lengths = lengths.clamp(max=1)
    # output_size: the row count is known, so no device-to-host sync to count them.
    seq_index = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), lengths,
                                        output_size=int(hidden.shape[0]) if mode == "mean" else None)
    one_row = cu_seqlens[:-1] if mode == "cls" else cu_seqlens[1:] - 1
    rows = hidden if mode == "mean" else hidden[one_row.long()[lengths > 0]]
    sums = torch.zeros(len(lengths), hidden.shape[1], device=hidden.device, dtype=torch.float32)
    sums.index_add_(0, seq_index, rows.float())
    out = sums / lengths.clamp(min=1)[:, None].float()
    return F.normalize(out, p=2, dim=1) if normalize else out


# OpenAI's gpt-oss SwiGLU ("swiglu_oai"): its config's `swiglu_alpha` and `swiglu_limit`, the
# only values supported (the kernels have them built in).
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def _swiglu_oai(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss's gated activation: the gate clamped from above, the up half to +-limit, then
    g * sigmoid(alpha * g) * (u + 1) (Hugging Face's GptOssExperts)."""
    g = gate.clamp(max=SWIGLU_OAI_LIMIT)
    u = up.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return g * torch.sigmoid(SWIGLU_OAI_ALPHA * g) * (u + 1)


# The gated activations of an MLP whose up-projection weight is `[gate; up]` (`[2I, K]`): the
# result `[.., I]` is a function of both halves, mostly gate_fn(gate) * up. Llama's SwiGLU,
# Gemma's GeGLU (Hugging Face's `gelu_pytorch_tanh` on the gate), ModernBERT's GeGLU (the exact,
# erf GELU: its "gelu") and gpt-oss's clamped SwiGLU (`_swiglu_oai`).
_GATED_FNS = {
    "silu_mul": lambda g, u: F.silu(g) * u,
    "gelu_tanh_mul": lambda g, u: F.gelu(g, approximate="tanh") * u,
    "gelu_mul": lambda g, u: F.gelu(g) * u,
    "swiglu_oai": _swiglu_oai,
}
GATED_ACTIVATIONS = frozenset(_GATED_FNS)


def gated_act(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate, up) where gate_up = [gate | up] along the last dim, in fp32, rounded once to
    gate_up's dtype; `activation` is one of GATED_ACTIVATIONS ("silu_mul": SwiGLU,
    "gelu_tanh_mul": GeGLU with the tanh GELU, "gelu_mul": GeGLU with the exact GELU, all
    act(gate) * up; "swiglu_oai": gpt-oss's clamped SwiGLU, see `_swiglu_oai`)."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(GATED_ACTIVATIONS)}, got {activation!r}")
    gate, up = gate_up.float().chunk(2, dim=-1)
    return _GATED_FNS[activation](gate, up).to(gate_up.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up where gate_up = [gate | up] along the last dim (Llama MLP)."""
    return gated_act(gate_up, "silu_mul")


def gate_group(x: torch.Tensor, gate: torch.Tensor) -> int:
    """How many consecutive elements of x each element of `gate` gates: 1 for a gate per element, a head's
    width for a gate per head; a ValueError where gate's elements do not divide x's evenly."""
    if x.numel() == 0 and gate.numel() == 0:
        return 1
    if gate.numel() == 0 or x.numel() % gate.numel():
        raise ValueError(f"gate has {gate.numel()} elements for x's {x.numel()}")
    return x.numel() // gate.numel()


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x * sigmoid(gate), read in x's order: an attention output gated before the output projection, per
    element (gate of x's number of elements: AFMoE's gate_proj, Qwen3-Next's gate half of q_proj) or per head
    (gate of one element per `group` consecutive ones of x, group = x's elements / gate's: Dots3's, Ling's and
    LFM3's g_proj, whose one value per head covers the head's columns). sigmoid(gate) is rounded to x's dtype
    before the product, as transformers' two ops round it, and the product once; `out` may be x itself."""
    group = gate_group(x, gate)
    s = torch.sigmoid(gate.float()).to(x.dtype).float()
    result = (x.float().reshape(-1, group) * s.reshape(-1, 1)).to(x.dtype).view(x.shape)
    return result if out is None else out.copy_(result)


def xielu(x: torch.Tensor, params: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """xIELU (Huang et al. 2024, arXiv 2411.13010: Apertus's plain-MLP activation), element by element:

        y = alpha_p * x^2 + beta * x                               for x > 0
        y = alpha_n * (expm1(min(x, eps)) - x) + beta * x          otherwise

    `params` is an fp32 tensor `[4]` on x's device: (alpha_p, alpha_n, beta, eps) as applied, i.e. a
    checkpoint's learnt alpha_p / alpha_n already through their softplus (alpha_p = softplus(a_p),
    alpha_n = beta + softplus(a_n)); read on the device, never on the host, so a captured graph
    replays it. Computed in fp32 and rounded to x's dtype once; `out` may be x itself (in place)."""
    if params.numel() != 4:
        raise ValueError(f"xielu takes 4 parameters (alpha_p, alpha_n, beta, eps), got {params.numel()}")
    alpha_p, alpha_n, beta, eps = params.float().unbind()
    h = x.float()
    negative = (torch.expm1(torch.minimum(h, eps)) - h) * alpha_n + beta * h
    result = torch.where(h > 0, alpha_p * h * h + beta * h, negative).to(x.dtype)
    return result if out is None else out.copy_(result)


def embedding_rms_norm(
    ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A Llama embedding layer and the first RMSNorm: (RMSNorm(rows), rows) with rows =
    table[ids], the residual stream the first decoder layer adds to. `scale` (Gemma: the square
    root of the hidden size) multiplies the rows as Hugging Face does: by the scale rounded to
    the table's dtype, the product rounded to it too; the norm sees the rounded rows."""
    rows = table[ids]
    if scale is not None:
        rows = rows * torch.tensor(scale, dtype=table.dtype, device=table.device)
    return rms_norm(rows, weight, eps)[0], rows


def embedding_part(ids: torch.Tensor, table: torch.Tensor, start: int, scale: float | None = None) -> torch.Tensor:
    """One rank's share of a vocabulary-parallel embedding: row t is table[ids[t] - start] where
    that id is among the table's rows (ids [start, start + len(table))), else zeros; times
    `scale` as embedding_rms_norm scales. Summed over the ranks (each id held by one of them,
    the others adding exact zeros) it is the whole table's rows."""
    local = ids.long() - start
    held = (local >= 0) & (local < table.shape[0])
    rows = torch.where(held[:, None], table[local.clamp(0, table.shape[0] - 1)], 0)
    if scale is not None:
        rows = rows * torch.tensor(scale, dtype=table.dtype, device=table.device)
    return rows


def softmax(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Row softmax over the last dim of scale * x, fp32 accumulation."""
    return torch.softmax(x.float() * scale, dim=-1).to(x.dtype)


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables `[len(positions), head_dim // 2]` for rotate-half rotary embeddings."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding (Llama/HF layout) on `[tokens, heads, head_dim]`."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rotary_in_place(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """`apply_rotary` written back into x `[T, H, D]` (a strided view is fine: an encoder passes
    the q and k heads of its QKV GEMM output, `qkv.view(T, 3H, D)[:, :2H]`, so the attention
    reads them where they are and nothing is copied). Row t of x takes row t of cos/sin
    `[T, D/2]`, or with `positions` (int `[T]`) row `positions[t]` of cos/sin tables computed
    once for every position (`rotary_cos_sin`). Returns x."""
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
    return x.copy_(apply_rotary(x, cos, sin))


def mla_latent_norms(a: torch.Tensor, q_width: int, q_norm: torch.Tensor | None, kv_norm: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Latent attention's two RMSNorms (models/mla.py) on the rows of its first projection's
    output `a` `[T, >= q_width + kv_width]`: the query latent a[:, :q_width] by q_norm and the
    key-value latent a[:, q_width : q_width + kv_width] by kv_norm (`[kv_width]`). With q_norm
    None (queries straight from q_proj, no latent) only the latter, q returned as None. Both as
    contiguous rows, each rounded once as rms_norm rounds it."""
    kv_width = kv_norm.shape[0]
    kv = rms_norm(a[:, q_width : q_width + kv_width].contiguous(), kv_norm, eps)[0]
    q = rms_norm(a[:, :q_width].contiguous(), q_norm, eps)[0] if q_norm is not None else None
    return q, kv


def mla_kv_to_cache(kv: torch.Tensor, k_pe: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Latent attention's keys and values into a paged cache of D-wide heads (models/mla.py):
    from kv `[T, H, nope + v]` (kv_b's output: each head's key dims without the rotary, then its
    values) and k_pe `[T, r]` (the rotary key all heads share; rows may be strided), head h of
    token t stores the key [rotary(k_pe[t]); kv[t, h, :nope]] with nope = D - r, and the value
    kv[t, h, nope:] padded with zeros to D. cos / sin `[T, r / 2]` (None: no rotary) rotate
    halves as apply_rotary does, rounded once."""
    t, heads = kv.shape[:2]
    d, r = k_cache.shape[-1], k_pe.shape[1]
    nope = d - r
    pe = k_pe.reshape(t, 1, r)
    if cos is not None:
        pe = apply_rotary(pe, cos, sin)
    k = torch.cat([pe.expand(t, heads, r), kv[:, :, :nope]], dim=2)
    v = F.pad(kv[:, :, nope:], (0, d - (kv.shape[2] - nope)))
    write_kv(k_cache, v_cache, k, v, slot_mapping)


def conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                  slots: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """One step of a depthwise causal convolution per row (hybrid models' short convolutions,
    models/mixers.py): row i `x[i]` `[C]` of the sequence holding state slot `slots[i]` sees the
    window [its last K - 1 inputs (`conv_state[slots[i]]`, `[C, K - 1]`, oldest first); x[i]];
    returns sum(window * weight, taps) (+ bias) through `activation` (None or "silu") in fp32,
    rounded once to x's dtype, and shifts x[i] into the state (fp32, in place).
    weight `[C, K]`, bias `[C]` or None, conv_state `[slots, C, K - 1]` fp32."""
    held = conv_state.index_select(0, slots)
    window = torch.cat([held, x[:, :, None].float()], dim=2)
    y = (window * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"unsupported convolution activation {activation!r} (supported: silu)")
    conv_state.index_copy_(0, slots, window[:, :, 1:])
    return y.to(x.dtype)


def conv1d_chunk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_state: torch.Tensor,
                 slot: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """A depthwise causal convolution over one sequence's T prompt rows x `[T, C]`, continuing from the
    last K - 1 inputs it saw (`conv_state[slot]`, `[C, K - 1]` fp32, oldest first; `slot` a 1-element long
    tensor): row t sees [the inputs before it; x[t]], K taps. Returns sum(window * weight) (+ bias)
    through `activation` (None or "silu") in fp32, rounded once to x's dtype (Hugging Face's Conv1d
    rounds its sum once), and leaves the last K - 1 inputs (fp32) at the slot."""
    k = weight.shape[1]
    if x.shape[0] == 0:
        return x.clone()
    padded = torch.cat([conv_state.index_select(0, slot)[0], x.float().t()], dim=1)  # [C, K - 1 + T]
    y = F.conv1d(padded[None], weight.float()[:, None, :], bias.float() if bias is not None else None,
                 groups=weight.shape[0])[0].t()
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"unsupported convolution activation {activation!r} (supported: silu)")
    conv_state.index_copy_(0, slot, padded[None, :, padded.shape[1] - (k - 1):])
    return y.to(x.dtype)


def cca_conv_decode(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                    conv_state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One step of ZAYA's CCA convolutions per row (models/zaya.py): row i `x[i]` `[C]` (G heads of D channels)
    of the sequence holding state slot `slots[i]` sees the window [its last K inputs (`conv_state[slots[i]]`,
    `[C, K]` fp32, oldest first); x[i]], K = (T0 - 1) + (T1 - 1). A depthwise convolution of T0 taps (w1 `[C, T0]`,
    b1 `[C]`) gives T1 outputs, rounded to x's dtype (transformers' first Conv1d, in the model's dtype); a
    convolution of T1 taps grouped by head (w2 `[C, D, T1]`: output channel o of head g reads that head's D
    channels, b2 `[C]`) gives the row's output, in fp32, rounded once to x's dtype. Shifts x[i] into the state
    (in place). w1, b1, w2, b2 fp32."""
    d = w2.shape[1]
    held = conv_state.index_select(0, slots)
    window = torch.cat([held, x[:, :, None].float()], dim=2)  # [N, C, K + 1]
    dw = F.conv1d(window, w1.float()[:, None, :], b1.float(), groups=w1.shape[0]).to(x.dtype).float()
    y = F.conv1d(dw, w2.float(), b2.float(), groups=w2.shape[0] // d)[:, :, 0]
    conv_state.index_copy_(0, slots, window[:, :, 1:])
    return y.to(x.dtype)


def gated_delta_inputs(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, neg_a: torch.Tensor,
                       dt_bias: torch.Tensor, num_k_heads: int, head_k_dim: int,
                       beta_scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    """A gated DeltaNet layer's per-token rule inputs (models/gated_deltanet.py), all fp32: from the
    convolved rows mixed `[T, 2 key_dim + value_dim]` ([q; k; v], the model's dtype) and the gate
    logits b, a `[T, Hv]`: q and k per value head `[T, Hv, K]` (L2-normalised with eps 1e-6, q times
    K ** -0.5; key head j serves value heads j * Hv / Hk ..), v `[T, Hv, V]`, g = neg_a * softplus(a +
    dt_bias) and beta = sigmoid(b) rounded to b's dtype (Hugging Face takes it there) times
    `beta_scale` (OLMo hybrid's 2: exact in any dtype), `[T, Hv]`."""
    rows, nv = b.shape
    kd = num_k_heads * head_k_dim

    def l2(t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(rows, num_k_heads, head_k_dim).float()
        t = t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)
        return t[:, :, None].expand(rows, num_k_heads, nv // num_k_heads, head_k_dim).reshape(rows, nv, head_k_dim)

    q, k = l2(mixed[:, :kd]) * head_k_dim ** -0.5, l2(mixed[:, kd : 2 * kd])
    v = mixed[:, 2 * kd :].reshape(rows, nv, (mixed.shape[1] - 2 * kd) // nv).float()
    g = neg_a * F.softplus(a.float() + dt_bias)
    return q, k, v, g, torch.sigmoid(b).float() * beta_scale


def gated_delta_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule for B sequences at once, all fp32: state `[B, H, K, V]`, q and k
    `[B, H, K]`, v `[B, H, V]`, g and beta `[B, H]`. S' = e^g S; u = beta (v - S'^T k); S = S' + k u^T;
    o = S^T q. Returns (o `[B, H, V]`, the new state)."""
    state = state * g.exp()[..., None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", state, k)
    update = (v - predicted) * beta[..., None]
    state = state + k[..., :, None] * update[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, q), state


DELTA_CHUNK = 64  # tokens per chunk of the gated delta rule's chunked form (FLA's and Hugging Face's)


def gated_delta_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      state: torch.Tensor, slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule over one sequence's T prompt tokens, from the state at its slot (`state`
    `[slots, H, K, V]` fp32, the slot's entry replaced by the state after the last token; `slot` a
    1-element long tensor): q and k `[T, H, K]`, v `[T, H, V]`, g and beta `[T, H]`, all fp32 (rows may
    be strided). Returns o `[T, H, V]` (fp32, or written into `out`, any float dtype, and returned).

    The chunked (WY) form, DELTA_CHUNK tokens at a time (models/gated_deltanet.py has the derivation):
    within a chunk, with G_t the cumulative sum of g from its start and S0 the state before it,

        (I + L) U = diag(beta) V - diag(beta e^G) K S0,   L_ts = beta_t e^(G_t - G_s) k_t . k_s  (s < t)
        o_t = e^(G_t) S0^T q_t + sum_(s <= t) e^(G_t - G_s) (q_t . k_s) u_s
        S_C = e^(G_C) S0 + sum_s e^(G_C - G_s) k_s u_s^T

    The last chunk is padded with tokens that change nothing (k = v = 0, g = beta = 0)."""
    length, heads, kd = k.shape
    vd = v.shape[-1]
    c = DELTA_CHUNK
    pad = -length % c
    q, k, v = (F.pad(t.transpose(0, 1), (0, 0, 0, pad)) for t in (q, k, v))  # [H, T + pad, .]
    g, beta = F.pad(g.t(), (0, pad)), F.pad(beta.t(), (0, pad))
    n = (length + pad) // c
    q, k = q.reshape(heads, n, c, kd), k.reshape(heads, n, c, kd)
    v, g, beta = v.reshape(heads, n, c, vd), g.reshape(heads, n, c), beta.reshape(heads, n, c)
    cum = g.cumsum(-1)  # G_t
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    # e^(G_t - G_s) for s <= t, 0 above the diagonal (masked before the exp: G_t - G_s > 0 there and may overflow)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    # I + L with L's strictly lower part; a unit-triangular solve reads only that part
    system = (beta[..., None] * (k @ k.transpose(-1, -2))) * decay
    u_base = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k * (beta * cum.exp())[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay  # (q_t . k_s) e^(G_t - G_s), s <= t
    q_from_state = q * cum.exp()[..., None]  # reads S0 decayed to t
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]  # writes decayed to the chunk's end
    chunk_decay = cum[..., -1].exp()[..., None, None]
    o = torch.empty(heads, n, c, vd, dtype=torch.float32, device=v.device)
    s = state.index_select(0, slot)[0]
    for i in range(n):
        u = u_base[:, i] - w[:, i] @ s
        o[:, i] = q_from_state[:, i] @ s + scores[:, i] @ u
        s = s * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ u
    state.index_copy_(0, slot, s[None])
    o = o.view(heads, n * c, vd)[:, :length].transpose(0, 1)
    return o if out is None else out.copy_(o)


def gated_delta_decode(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, neg_a: torch.Tensor,
                       dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                       num_k_heads: int, beta_scale: float = 1.0) -> torch.Tensor:
    """One decode step of a gated DeltaNet layer per row: the rule's inputs from its convolved row
    (gated_delta_inputs, beta times `beta_scale`), one step of the rule on the state at its slot (`state`
    `[slots, Hv, K, V]` fp32, updated in place), the output `[rows, Hv, V]` rounded to mixed's dtype."""
    q, k, v, g, beta = gated_delta_inputs(mixed, b, a, neg_a, dt_bias, num_k_heads, state.shape[2], beta_scale)
    out, new = gated_delta_step(state.index_select(0, slots), q, k, v, g, beta)
    state.index_copy_(0, slots, new)
    return out.to(mixed.dtype)


def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated DeltaNet's output norm: per head (o `[T, H, V]`), RMSNorm(o) rounded to o's dtype, times
    weight `[V]` (rounded), times silu(z) (z `[T, H * V]`, fp32), rounded once: Hugging Face's order."""
    of = o.float()
    normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype) * weight
    return (normed.float() * F.silu(z.reshape(o.shape).float())).to(o.dtype)


def ssd_decode(xbc: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor,
               state: torch.Tensor, slots: torch.Tensor, num_groups: int,
               dt_limit: tuple[float, float] = (0.0, float("inf"))) -> torch.Tensor:
    """One decode step of a Mamba-2 layer per row (models/mamba2.py): from its convolved row xbc
    `[rows, H * P + 2 G * N]` ([x; B; C], the model's dtype) and its raw dt `[rows, H]`, with
    dt = clamp(softplus(dt + dt_bias), dt_limit) in the model's dtype (as Hugging Face computes it),
    the state S `[H, P, N]` at its slot (`state` `[slots, H, P, N]` fp32, updated in place):
    S = exp(dt A) S + dt x B^T (B, C of the head's group: H / G consecutive heads share one), and
    y = S C + D x, returned fp32 `[rows, H, P]`. A, D `[H]` fp32."""
    rows, heads = dt.shape
    p, n = state.shape[2], state.shape[3]
    inner = heads * p
    dt = F.softplus(dt + dt_bias).clamp(*dt_limit).float()
    x = xbc[:, :inner].float().view(rows, heads, p)

    def per_head(t: torch.Tensor) -> torch.Tensor:
        return t.float().view(rows, num_groups, 1, n).expand(rows, num_groups, heads // num_groups, n).reshape(
            rows, heads, n)

    b, c = per_head(xbc[:, inner : inner + num_groups * n]), per_head(xbc[:, inner + num_groups * n :])
    new = (state.index_select(0, slots) * torch.exp(dt * A)[:, :, None, None]
           + (dt[:, :, None] * x)[..., None] * b[:, :, None, :])
    state.index_copy_(0, slots, new)
    return torch.einsum("rhpn,rhn->rhp", new, c) + D[:, None] * x


def ssd_chunk(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
              state: torch.Tensor, slot: torch.Tensor, chunk_size: int = 256) -> torch.Tensor:
    """A Mamba-2 layer's recurrence over one sequence's T prompt tokens (models/mamba2.py), from the
    state S `[H, P, N]` at its slot (`state` `[slots, H, P, N]` fp32, the slot's entry replaced by the
    state after the last token; `slot` a 1-element long tensor): x `[T, H, P]`, dt `[T, H]` (after its
    softplus and clamp), A `[H]`, b / c `[T, G, N]` (heads / groups consecutive heads share one), all
    fp32 (rows may be strided). Returns y without D's skip `[T, H, P]` fp32.

    The chunked form, `chunk_size` tokens at a time (Hugging Face's `chunk_size`; a kernel may chunk
    otherwise: the same sums, rounded differently): with a_k = dt_k A the log-decay of token k, token t
    sees token u <= t through exp(sum of a over (u, t]) and the entering state through exp(sum of a
    over [0, t]). The sums over (u, t] are masked cumulative sums of a, not differences of running
    totals (those lose the small sums' precision where the totals are large)."""
    heads = x.shape[1]
    groups = b.shape[1]
    if groups != heads:
        b, c = b.repeat_interleave(heads // groups, dim=1), c.repeat_interleave(heads // groups, dim=1)
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    s = state.index_select(0, slot)[0]
    for start in range(0, x.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        xs, n = x[part], x[part].shape[0]
        a = (dt[part] * A).t()  # [H, n]
        # between[h, t, u] = sum of a[h, k] for u < k <= t (lower triangle incl. the diagonal, -inf above)
        after = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=-1)  # [k, u]: k > u
        between = torch.cumsum(a[:, :, None].expand(-1, n, n).masked_fill(~after, 0.0), dim=1)  # [H, t, u]
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device))
        decay = torch.exp(between.masked_fill(~causal, float("-inf")))  # [H, t, u]
        scores = torch.einsum("thn,uhn->htu", c[part], b[part]) * decay  # [H, t, u]
        xdt = xs * dt[part][:, :, None]  # [n, H, P]
        entering = torch.exp(torch.cumsum(a, dim=1))  # [H, t]: the entering state's decay to t (incl. t)
        y[part] = (torch.einsum("htu,uhp->thp", scores, xdt)
                   + torch.einsum("hpn,thn->thp", s, c[part]) * entering.t()[:, :, None])
        to_end = decay[:, n - 1, :]  # [H, u]: exp(sum of a over (u, n - 1])
        s = s * entering[:, n - 1, None, None] + torch.einsum("uhp,uhn->hpn", xdt * to_end.t()[:, :, None], b[part])
    state.index_copy_(0, slot, s[None])
    return y


def mamba_gated_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor | None, num_groups: int, eps: float,
                     order: str = "gated", squares: torch.Tensor | None = None,
                     group_size: int | None = None) -> torch.Tensor:
    """Mamba-2's output norm over rows y `[T, I]` (fp32) with the gate silu(z) (z `[T, I]`, the model's
    dtype), in fp32, rounded once to z's dtype: "gated" RMSNorm(y * silu(z)) per group of I / G values
    times weight (Mamba-2's, Granite's, Bamba's); "before_gate" RMSNorm(y) * weight * silu(z) (Falcon-H1's
    default); "none" y * silu(z). With `squares` `[T, G]` (fp32) each group's mean square is
    squares / group_size instead of its own values': a group whose values are split over the ranks of a
    tensor-parallel group, its sums of squares (mamba_gated_squares) all-reduced."""
    gate = F.silu(z.float())
    if order == "none":
        return (y * gate).to(z.dtype)
    g = (y * gate if order == "gated" else y).view(y.shape[0], num_groups, y.shape[1] // num_groups)
    mean_square = g.pow(2).mean(-1, keepdim=True) if squares is None else squares[..., None] / group_size
    g = (g * torch.rsqrt(mean_square + eps)).view(y.shape) * weight
    return (g if order == "gated" else g * gate).to(z.dtype)


def mamba_gated_squares(y: torch.Tensor, z: torch.Tensor, num_groups: int, order: str = "gated") -> torch.Tensor:
    """Each group's sum of the squares mamba_gated_norm takes the mean of (of y * silu(z) for "gated", of y
    for "before_gate"): `[T, G]` fp32."""
    g = y * F.silu(z.float()) if order == "gated" else y
    return g.view(y.shape[0], num_groups, y.shape[1] // num_groups).pow(2).sum(-1)


def kda_inputs(mixed: torch.Tensor, f: torch.Tensor, b: torch.Tensor, neg_a: torch.Tensor,
               dt_bias: torch.Tensor, lower_bound: float | None = None,
               round_decay: bool = False) -> tuple[torch.Tensor, ...]:
    """A Kimi Delta Attention layer's per-token rule inputs (models/kda.py), all fp32: from the convolved
    rows mixed `[T, 2 H K + H V]` ([q; k; v], the model's dtype), the forget gate's logits f `[T, H K]` and the
    beta logits b `[T, H]` (the model's dtype; rows at any stride): q and k `[T, H, K]` L2-normalised (x /
    sqrt(sum x^2 + 1e-6); q also times K ** -0.5), v `[T, H, V]`, the per-channel log decay
    g = neg_a[h] * softplus(f + dt_bias) `[T, H, K]` (neg_a `[H]`, dt_bias `[H K]` fp32; softplus as
    log(1 + exp(x)), x itself above 20: Hugging Face's form) and beta = sigmoid(b) rounded to b's dtype.
    `lower_bound` (Ling 3.0's bounded gate): g = lower_bound * sigmoid(-neg_a[h] * (f + dt_bias)) instead;
    `round_decay`: g rounded to f's dtype (and back to fp32), as Ling 3.0's forget gate returns it."""
    rows, heads = b.shape
    kd = f.shape[1]
    k_dim = kd // heads

    def l2(t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(rows, heads, k_dim).float()
        return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)

    q, k = l2(mixed[:, :kd]) * k_dim ** -0.5, l2(mixed[:, kd : 2 * kd])
    v = mixed[:, 2 * kd :].reshape(rows, heads, (mixed.shape[1] - 2 * kd) // heads).float()
    x = f.float() + dt_bias
    if lower_bound is None:
        g = neg_a[:, None] * torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x))).view(rows, heads, k_dim)
    else:
        g = lower_bound * torch.sigmoid(-neg_a[:, None] * x.view(rows, heads, k_dim))
    if round_decay:
        g = g.to(f.dtype).float()
    return q, k, v, g, torch.sigmoid(b).float()


def kda_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule with a decay per key channel, B sequences at once, all fp32: state
    `[B, H, K, V]`, q, k and g `[B, H, K]`, v `[B, H, V]`, beta `[B, H]`. S' = diag(e^g) S; u = beta (v - S'^T k);
    S = S' + k u^T; o = S^T q. Returns (o `[B, H, V]`, the new state)."""
    state = state * g.exp()[..., None]
    update = (v - torch.einsum("bhkv,bhk->bhv", state, k)) * beta[..., None]
    state = state + k[..., :, None] * update[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, q), state


def kda_decode(mixed: torch.Tensor, f: torch.Tensor, b: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor,
               state: torch.Tensor, slots: torch.Tensor, lower_bound: float | None = None,
               round_decay: bool = False) -> torch.Tensor:
    """One decode step of a Kimi Delta Attention layer per row: the rule's inputs from its convolved row and gate
    logits (kda_inputs, with its `lower_bound` and `round_decay`), one step of the rule on the state at its slot
    (`state` `[slots, H, K, V]` fp32, updated in place), the output `[rows, H, V]` rounded to mixed's dtype."""
    q, k, v, g, beta = kda_inputs(mixed, f, b, neg_a, dt_bias, lower_bound, round_decay)
    out, new = kda_step(state.index_select(0, slots), q, k, v, g, beta)
    state.index_copy_(0, slots, new)
    return out.to(mixed.dtype)


def kda_gated_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Kimi Delta Attention's output norm: per head (o `[T, H, V]`), RMSNorm(o) times weight `[V]` times
    sigmoid(gate) (gate `[T, H * V]`, rows at any stride), all in fp32, rounded once to o's dtype: Hugging
    Face's (and FLA's) order, which never rounds in between."""
    of = o.float()
    normed = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (normed * torch.sigmoid(gate.reshape(o.shape).float())).to(o.dtype)


def kda_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Kimi Delta Attention's rule (the gated delta rule with a decay per key channel, models/kda.py) over one
    sequence's T prompt tokens, from the state at its slot (`state` `[slots, H, K, V]` fp32, the slot's entry
    replaced by the state after the last token; `slot` a 1-element long tensor): q, k and the log decays g
    `[T, H, K]`, v `[T, H, V]`, beta `[T, H]`, all fp32 (rows may be strided). Returns o `[T, H, V]` (fp32, or
    written into `out`, any float dtype, and returned).

    The chunked (WY) form, DELTA_CHUNK tokens at a time: within a chunk, with G_t the cumulative sum of g from
    its start (a vector over key channels), S0 the state before it and * per channel,

        (I + L) U = diag(beta) V - diag(beta) (K * e^G) S0,   L_ts = beta_t sum_c k_t[c] k_s[c] e^(G_t[c] - G_s[c])
        o_t = (q_t * e^(G_t))^T S0 + sum_(s <= t) (sum_c q_t[c] k_s[c] e^(G_t[c] - G_s[c])) u_s
        S_C = diag(e^(G_C)) S0 + sum_s diag(e^(G_C - G_s)) k_s u_s^T   (s < t in L)

    Every exponent is <= 0 (g <= 0; the differences taken before the exp, masked above the diagonal), so nothing
    overflows; a chunk costs a `[H, C, C, K]` decay tensor and two triangular solves, the pass from chunk to chunk
    is sequential. Transformers' torch fallback (chunk_kimi_delta_attention, written from FLA's chunk_kda) runs
    the same form in fp32."""
    length, heads, kd = k.shape
    vd = v.shape[-1]
    q, k, v, g = (t.transpose(0, 1) for t in (q, k, v, g))  # [H, T, .]
    beta = beta.t()
    o = torch.empty(heads, length, vd, dtype=torch.float32, device=v.device)
    s = state.index_select(0, slot)[0]
    c = DELTA_CHUNK
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    for start in range(0, length, c):
        part = slice(start, min(start + c, length))
        n = part.stop - start
        qc, kc, vc, bc = q[:, part], k[:, part], v[:, part], beta[:, part]
        cum = g[:, part].cumsum(1)  # G_t [H, n, K]
        # e^(G_t - G_s) per channel for s <= t, 0 above the diagonal (masked before the exp: positive there)
        decay = (cum[:, :, None] - cum[:, None]).masked_fill(~causal[:n, :n, None], float("-inf")).exp()
        # I + L with L's strictly lower part; a unit-triangular solve reads only that part
        system = bc[..., None] * (kc[:, :, None] * decay * kc[:, None]).sum(-1)
        u_base = torch.linalg.solve_triangular(system, vc * bc[..., None], upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(system, kc * cum.exp() * bc[..., None], upper=False, unitriangular=True)
        scores = (qc[:, :, None] * decay * kc[:, None]).sum(-1)  # sum_c q_t[c] k_s[c] e^(G_t[c] - G_s[c]), s <= t
        u = u_base - w @ s
        o[:, part] = (qc * cum.exp()) @ s + scores @ u
        last = cum[:, -1:]  # G_C [H, 1, K]
        s = s * last.transpose(1, 2).exp() + (kc * (last - cum).exp()).transpose(1, 2) @ u
    state.index_copy_(0, slot, s[None])
    o = o.transpose(0, 1)
    return o if out is None else out.copy_(o)

LIGHTNING_CHUNK = 64  # tokens per block of lightning attention's chunked form (any size gives the same sums)


def lightning_inputs(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lightning attention's q, k, v `[T, H, D]` (fp32) from its projection's rows `[T, 3 H D]` (rows at any
    stride), each head's [q | k | v] side by side: SiLU of each, rounded to the projection's dtype (Hugging Face
    applies the activation in the model's dtype)."""
    rows = qkv.shape[0]
    act = F.silu(qkv.float()).to(qkv.dtype).float().reshape(rows, heads, 3, qkv.shape[1] // (3 * heads))
    return act[:, :, 0], act[:, :, 1], act[:, :, 2]


def lightning_decode(qkv: torch.Tensor, decay: torch.Tensor, state: torch.Tensor,
                     slots: torch.Tensor) -> torch.Tensor:
    """One decode step of a lightning-attention layer per row (MiniMax, models/lightning.py): q, k, v from its
    projection row (lightning_inputs), the state S `[D, D]` of each head at the row's slot (`state`
    `[slots, H, D, D]` fp32, updated in place) decayed by the head's fixed factor `decay` `[H]` (fp32, e^-slope)
    plus k^T v, then o = q S: `[rows, H, D]` rounded to qkv's dtype."""
    q, k, v = lightning_inputs(qkv, state.shape[1])
    s = state.index_select(0, slots) * decay.float()[None, :, None, None] + k[..., :, None] * v[..., None, :]
    state.index_copy_(0, slots, s)
    return (q[..., None, :] @ s)[..., 0, :].to(qkv.dtype)


def lightning_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor, state: torch.Tensor,
                    slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Lightning attention (S_t = e^-lambda S_(t-1) + k_t^T v_t, o_t = q_t S_t, lambda = `slope[h]` `[H]` fp32)
    over one sequence's T prompt tokens, from the state at its slot (`state` `[slots, H, D, D]` fp32, the slot's
    entry replaced by the state after the last token; `slot` a 1-element long tensor): q, k, v `[T, H, D]` fp32
    (rows may be strided). Returns o `[T, H, D]` (fp32, or written into `out`, any float dtype, and returned).

    The block form, LIGHTNING_CHUNK tokens at a time: within a block of n tokens (t, s counted from its start),
    with S0 the state before it,

        o_t = e^(-lambda (t + 1)) q_t S0 + sum_(s <= t) e^(-lambda (t - s)) (q_t . k_s) v_s
        S_n = e^(-lambda n) S0 + sum_s e^(-lambda (n - 1 - s)) k_s^T v_s

    Every exponent is <= 0 (masked above the diagonal before the exp); only the pass from block to block is
    sequential. Hugging Face's prompt path computes the same form (in blocks of `block_size`)."""
    length, heads, _ = q.shape
    q, k, v = (t.float().transpose(0, 1) for t in (q, k, v))  # [H, T, D]
    lam = slope.float().reshape(heads, 1, 1)
    o = torch.empty_like(v)
    s = state.index_select(0, slot)[0]
    for start in range(0, length, LIGHTNING_CHUNK):
        part = slice(start, min(start + LIGHTNING_CHUNK, length))
        n = part.stop - start
        qc, kc, vc = q[:, part], k[:, part], v[:, part]
        pos = torch.arange(n, device=q.device, dtype=torch.float32)
        gap = pos[:, None] - pos[None, :]  # t - s
        decay = torch.where(gap >= 0, -lam * gap, float("-inf")).exp()  # [H, n, n]
        o[:, part] = ((qc @ kc.transpose(1, 2)) * decay) @ vc + (qc * (-lam * (pos[:, None] + 1)).exp()) @ s
        s = s * (-lam * n).exp() + (kc * (-lam * (n - 1 - pos[:, None])).exp()).transpose(1, 2) @ vc
    state.index_copy_(0, slot, s[None])
    o = o.transpose(0, 1)
    return o if out is None else out.copy_(o)


def selective_scan_decode(x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, z: torch.Tensor,
                          dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                          slots: torch.Tensor) -> torch.Tensor:
    """One decode step of a Mamba-1 layer per row (models/mamba1.py): from its convolved row x `[rows, I]`,
    its dt before the bias `[rows, I]` (dt_proj's output), B and C `[rows, N]` and the gate z `[rows, I]` (all
    the model's dtype, rows at any stride), with dt = softplus(dt + dt_bias) in fp32, the state h `[I, N]` at
    its slot (`state` `[slots, I, N]` fp32, updated in place): h = exp(dt A) h + dt x B (A `[I, N]` fp32, per
    channel and state), and (h C + D x) * silu(z) (D `[I]` fp32), returned in the model's dtype. As Hugging
    Face's scan rounds: h C in the model's dtype (h rounded first), silu(z) in the model's dtype, the rest
    fp32, rounded once."""
    dtype = x.dtype
    xf = x.float()
    delta = F.softplus(dt.float() + dt_bias.float())  # [rows, I]
    new = (state.index_select(0, slots) * torch.exp(delta[:, :, None] * A)
           + (delta * xf)[:, :, None] * b.float()[:, None, :])
    state.index_copy_(0, slots, new)
    y = (new.to(dtype).float() * c.to(dtype).float()[:, None, :]).sum(-1).to(dtype).float()
    return ((y + D * xf) * F.silu(z).float()).to(dtype)


def rglru_decode(x: torch.Tensor, y: torch.Tensor, input_gate_w: torch.Tensor, input_gate_b: torch.Tensor,
                 a_gate_w: torch.Tensor, a_gate_b: torch.Tensor, a_rate: torch.Tensor, state: torch.Tensor,
                 slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One decode step of RecurrentGemma's RG-LRU per row (models/recurrent_gemma.py): from its convolved row x
    `[rows, W]` and its GELU branch y `[rows, W]` (the model's dtype, rows at any stride), per head h of the
    W / H channels of a block (weights `[H, B, B]`, biases `[H, B]`, the model's dtype) the input gate
    i = sigmoid(x_h W_i + b_i) and the recurrence gate r = sigmoid(x_h W_a + b_a); log a = -8 r a_rate (a_rate
    `[W]`: softplus of the recurrent parameter, in the model's dtype), a = exp(log a); the input normalised
    x i sqrt(1 - a^2) (at position 0: x i, and a = 0); the state h `[W]` at its slot (`state` `[slots, W]` fp32,
    updated in place) h = a h + that, in fp32; returns h (rounded) times y. Every step before the state rounds to
    the model's dtype as Hugging Face computes it there (each op's result in the model's dtype)."""
    dtype = x.dtype
    rows, width = x.shape
    heads, block = input_gate_w.shape[:2]

    def r(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float()

    xf = x.float()
    xh = xf.view(rows, heads, block)
    gi = r(torch.sigmoid(r(torch.einsum("thi,hij->thj", xh, input_gate_w.float()) + input_gate_b.float())))
    ga = r(torch.sigmoid(r(torch.einsum("thi,hij->thj", xh, a_gate_w.float()) + a_gate_b.float())))
    log_a = r(-8.0 * ga.reshape(rows, width) * a_rate.float())
    a = r(torch.exp(log_a))
    multiplier = r(torch.sqrt(r(1.0 - r(torch.exp(2.0 * log_a)))))
    reset = (positions == 0)[:, None]
    multiplier = torch.where(reset, torch.ones_like(multiplier), multiplier)
    a = torch.where(reset, torch.zeros_like(a), a)
    normed = r(r(xf * gi.reshape(rows, width)) * multiplier)
    new = a * state.index_select(0, slots) + normed
    state.index_copy_(0, slots, new)
    return (r(new) * y.float()).to(dtype)


SCAN_ELEMENTS = 1 << 24  # selective_scan_chunk's block: at most this many [tokens, intermediate, state] fp32 values


def selective_scan_chunk(x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, z: torch.Tensor,
                         dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
                         slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A Mamba-1 layer's selective scan over one sequence's L prompt tokens (models/mamba1.py), from the state h
    `[I, N]` at its slot (`state` `[slots, I, N]` fp32, the slot's entry replaced by the state after the last
    token; `slot` a 1-element long tensor): x, dt (before its bias) and z `[L, I]`, B and C `[L, N]`, all the
    model's dtype (rows may be strided); dt_bias, D `[I]` and A `[I, N]` fp32. Per token, with dt =
    softplus(dt + dt_bias) in fp32, h = exp(dt A) h + dt x B, and the output (h C + D x) * silu(z) rounded as
    selective_scan_decode's (h C in the model's dtype, silu(z) in the model's dtype, the rest fp32, rounded
    once). Returns y `[L, I]` in x's dtype (or written into `out` and returned).

    The tokens are scanned in blocks (as many as SCAN_ELEMENTS allow), the state carried between blocks: within
    a block the pairs (decay, input) compose associatively, (a1, b1) then (a2, b2) = (a1 a2, a2 b1 + b2), so
    log2(block) whole-tensor steps give every token's h (Hillis and Steele's prefix scan)."""
    length, inner = x.shape
    n = A.shape[1]
    block = max(1, SCAN_ELEMENTS // (inner * n))
    dtype = x.dtype
    xf = x.float()
    delta = F.softplus(dt.float() + dt_bias)  # [L, I]
    gate = F.silu(z).float()
    y = torch.empty_like(x) if out is None else out
    held = state.index_select(0, slot)[0]
    for start in range(0, length, block):
        part = slice(start, start + block)
        decay = torch.exp(delta[part, :, None] * A)  # [l, I, N]
        h = (delta[part] * xf[part])[:, :, None] * b[part].float()[:, None, :]
        h[0] += decay[0] * held
        step = 1
        while step < h.shape[0]:  # h[t] = sum over u <= t of (prod of decay over (u, t]) * input u
            h = torch.cat([h[:step], h[step:] + decay[step:] * h[:-step]])
            decay = torch.cat([decay[:step], decay[step:] * decay[:-step]])
            step *= 2
        held = h[-1]
        scan = torch.einsum("lin,ln->li", h.to(dtype).float(), c[part].to(dtype).float()).to(dtype).float()
        y[part] = ((scan + D * xf[part]) * gate[part]).to(y.dtype)
    state.index_copy_(0, slot, held[None])
    return y


def qkv_split(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Add the fused QKV bias and split `[tokens, (H + 2*Hkv) * D]` into q `[T, H, D]`,
    k and v `[T, Hkv, D]`."""
    if bias is not None:
        qkv = qkv + bias
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    t = qkv.shape[0]
    return (
        q.reshape(t, num_heads, head_dim),
        k.reshape(t, num_kv_heads, head_dim),
        v.reshape(t, num_kv_heads, head_dim),
    )


def qkv_split_rotary(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv_split, then rotary embedding on q and k (Llama): one pass over the QKV GEMM output."""
    q, k, v = qkv_split(qkv, bias, num_heads, num_kv_heads, head_dim)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v.contiguous()


def check_attention_options(causal: bool, window: int | None, softcap: float | None) -> None:
    """ValueError unless `window` is None or a positive integer, and `softcap` None or positive
    (the attention ops' rules, kernels' and references' alike)."""
    if window is not None:
        if int(window) != window or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive, got {softcap!r}")


def check_attention_chunk(causal: bool, window: int | None, chunk: int | None) -> None:
    """ValueError unless `chunk` is None or a positive integer on causal attention without a
    sliding window (the attention ops' rule, kernels' and references' alike)."""
    if chunk is None:
        return
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    if not causal or window is not None:
        raise ValueError("chunked attention is causal and has no sliding window")


def check_attention_sinks(sinks: torch.Tensor | None, num_heads: int) -> None:
    """ValueError unless `sinks` is None or a float tensor `[num_heads]`: one sink logit per
    query head (the attention ops' rule, kernels' and references' alike)."""
    if sinks is None:
        return
    if tuple(sinks.shape) != (num_heads,) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a float tensor [num_heads] = [{num_heads}], "
                         f"got {sinks.dtype} {tuple(sinks.shape)}")


def check_attention_alibi(alibi_slopes: torch.Tensor | None, num_heads: int, causal: bool) -> None:
    """ValueError unless `alibi_slopes` is None or a float tensor `[num_heads]` on causal attention:
    one ALiBi slope per query head (the attention ops' rule, kernels' and references' alike)."""
    if alibi_slopes is None:
        return
    if tuple(alibi_slopes.shape) != (num_heads,) or not alibi_slopes.is_floating_point():
        raise ValueError(f"alibi_slopes must be a float tensor [num_heads] = [{num_heads}], "
                         f"got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
    if not causal:
        raise ValueError("ALiBi (alibi_slopes) is supported on causal attention")


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    max_seqlen_q: int | None = None,
    out: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over packed sequences, no padding and no mask tensor.

    q: `[Tq, H, D]`; k, v: `[Tk, Hkv, D]` with H a multiple of Hkv (grouped-query heads).
    Sequence i owns rows cu_seqlens_q[i]:cu_seqlens_q[i+1] of q and cu_seqlens_k[i]:
    cu_seqlens_k[i+1] of k/v. With `causal`, queries are aligned to the *end* of their keys
    (query j of a sequence with Lq queries and Lk keys sits at position p = Lk - Lq + j and sees
    keys 0 .. p), which covers prefill (Lq == Lk), chunked prefill and decode against a KV cache
    (Lq < Lk). `window` (sliding-window attention) with `causal` narrows that to the last
    `window` keys, p - window < k <= p: Hugging Face's `sliding_window` (its mask keeps
    kv_idx > q_idx - sliding_window). Without `causal` the window is symmetric: query position
    p (aligned to the end of its keys as above) sees keys |k - p| <= window // 2, ModernBERT's
    local attention with window = its `local_attention` (Hugging Face's bidirectional sliding
    mask keeps |q_idx - kv_idx| <= local_attention // 2). `softcap` (Gemma 2) caps the scores
    before masking and softmax: softcap * tanh(scale * q.k / softcap). `sinks` (gpt-oss's
    attention sinks, `[H]`, any float dtype, read as fp32) adds one logit per query head to every
    softmax's normaliser, not scaled and attached to no value: p_j = exp(s_j) / (sum_i exp(s_i) +
    exp(sinks[h])), Hugging Face's softmax over the scores with the sink's column appended, that
    column then dropped. `chunk` (Llama 4's chunked attention, causal only, no window) narrows
    the causal keys to the query's chunk: p // chunk * chunk <= k <= p (Hugging Face's chunked
    mask keeps kv_idx // chunk == q_idx // chunk). `alibi_slopes` (ALiBi: BLOOM, MPT, Falcon-RW;
    `[H]`, any float dtype, read as fp32; causal only) adds slope_h * (k - p) to query head h's
    score of key k at query position p, after the scaling and any soft-capping: Hugging Face's
    slope_h * k (or MPT's slope_h * (k - Lk + 1)) up to a constant per query row, which the
    softmax cancels. A query that sees no key gets zeros.
    `max_seqlen_q` (optional) spares a kernel a device-to-host sync to size its grid.
    Returns `[Tq, H, D]` (in `out` when given).
    """
    check_attention_options(causal, window, softcap)
    check_attention_sinks(sinks, q.shape[1])
    check_attention_chunk(causal, window, chunk)
    check_attention_alibi(alibi_slopes, q.shape[1], causal)
    if sinks is not None:
        sinks = sinks.to(device=q.device, dtype=torch.float32)
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q) if out is None else out
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        qs = q[cq[i] : cq[i + 1]].transpose(0, 1)  # [H, Lq, D]
        ks = k[ck[i] : ck[i + 1]].transpose(0, 1)
        vs = v[ck[i] : ck[i + 1]].transpose(0, 1)
        lq, lk = qs.shape[1], ks.shape[1]
        if lq == 0:
            continue
        if group > 1:
            ks = ks.repeat_interleave(group, dim=0)
            vs = vs.repeat_interleave(group, dim=0)
        # A window covering every key (window >= Lk) changes nothing: the plain causal path.
        win = window if window is not None and window < lk else None
        mask = None
        if causal and (lq > 1 or win is not None or chunk is not None):
            q_pos = torch.arange(lk - lq, lk, device=q.device)[:, None]
            k_pos = torch.arange(lk, device=q.device)[None, :]
            mask = k_pos <= q_pos
            if win is not None:
                mask = mask & (k_pos > q_pos - win)
            if chunk is not None:
                mask = mask & (k_pos >= q_pos // chunk * chunk)
        elif window is not None and not causal:  # symmetric window
            q_pos = torch.arange(lk - lq, lk, device=q.device)[:, None]
            k_pos = torch.arange(lk, device=q.device)[None, :]
            mask = (k_pos - q_pos).abs() <= window // 2
        if softcap is None and sinks is None and alibi_slopes is None:
            o = F.scaled_dot_product_attention(qs.float(), ks.float(), vs.float(), attn_mask=mask, scale=scale)
        else:
            s = qs.float() @ ks.float().transpose(-1, -2) * (qs.shape[-1] ** -0.5 if scale is None else scale)
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            if alibi_slopes is not None:  # slope_h * (key position - query position), in fp32
                keys, queries = torch.arange(lk, device=q.device), torch.arange(lk - lq, lk, device=q.device)
                distance = keys[None, :] - queries[:, None]
                s = s + alibi_slopes.to(device=q.device, dtype=torch.float32)[:, None, None] * distance
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            if sinks is None:
                p = torch.softmax(s, dim=-1)
                if mask is not None:  # a query that sees no key (Lk < Lq): zeros, as without softcap
                    p = p.masked_fill(~mask.any(-1, keepdim=True), 0.0)
            else:
                # Softmax over [keys, the head's sink logit], the sink's column dropped. A query
                # that sees no key puts all its weight on the sink: zeros, as without sinks.
                sink = sinks[:, None, None].expand(-1, lq, 1)
                p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
            o = p @ vs.float()
        if window is not None and not causal:  # a query that sees no key (Lq > Lk): zeros
            o = o.masked_fill(~mask.any(-1)[None, :, None], 0.0)
        out[cq[i] : cq[i + 1]] = o.transpose(0, 1).to(q.dtype)
    return out


def disentangled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    c2p: torch.Tensor,
    p2c: torch.Tensor,
    rel_index: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
    out: torch.Tensor | None = None,
    first_column: int = 0,
) -> torch.Tensor:
    """DeBERTa's disentangled attention over packed sequences (bidirectional, no mask tensor).

    q, k, v: `[T, H, D]`; c2p, p2c: `[T, H, R]` (any strides), the per-token position scores
    c2p[t, h, r] = q_t . pos_k[h, r] and p2c[t, h, r] = k_t . pos_q[h, r]; rel_index: int `[2 * reach + 1]`,
    the position-score column of a relative distance, idx(d) = rel_index[clamp(d, -reach, reach) + reach]
    (the caller makes it saturate past `reach`). Within each sequence of cu_seqlens, query i and key j:
    score = scale * (q_i . k_j + c2p[i, h, idx(i - j)] + p2c[j, h, idx(i - j)]), softmax over j, then
    the weighted sum of v. `first_column`: c2p and p2c hold only the columns from that one on
    (column c is read at c - first_column: a batch of short sequences needs only the columns of
    its distances). `max_seqlen` is unused here (the kernel sizes its grid with it).
    Returns `[T, H, D]` (in `out` when given)."""
    reach = (rel_index.shape[0] - 1) // 2
    out = torch.empty_like(q) if out is None else out
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        pos = torch.arange(hi - lo, device=q.device)
        idx = rel_index.long()[(pos[:, None] - pos[None, :]).clamp(-reach, reach) + reach] - first_column  # [i, j]
        qs, ks, vs = (x[lo:hi].transpose(0, 1).float() for x in (q, k, v))  # [H, L, D]
        heads = qs.shape[0]
        c = c2p[lo:hi].transpose(0, 1).float()  # [H, L, R], row i
        p = p2c[lo:hi].transpose(0, 1).float()  # [H, L, R], row j
        c2p_ij = torch.gather(c, 2, idx[None].expand(heads, -1, -1))  # c2p[i, idx(i - j)]
        p2c_ij = torch.gather(p, 2, idx.t()[None].expand(heads, -1, -1)).transpose(1, 2)  # p2c[j, idx(i - j)]
        s = (qs @ ks.transpose(1, 2) + c2p_ij + p2c_ij) * scale
        out[lo:hi] = (torch.softmax(s, dim=-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def linear_bias_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    approximate: str = "none",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """GELU(x @ weight^T + bias): BERT's FFN up-projection with its bias and activation.

    x `[M, K]`, weight `[N, K]` (nn.Linear layout), bias `[N]` or None. A kernel fuses the
    bias + GELU of `bias_gelu` into the GEMM's epilogue, so the `[M, N]` activation is written
    once instead of written, read back and written again; here it is the two ops in sequence.
    """
    return bias_gelu(F.linear(x, weight), bias, approximate, out=out)


LINEAR_ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu2", "relu", "silu_mul", "gelu_tanh_mul", "gelu_mul",
                      "swiglu_oai")
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}  # linear_act's GELUs as bias_gelu's `approximate`


def gelu_activation(approximate: str) -> str:
    """linear_act's name for the GELU a config calls `approximate` ("none" or "tanh")."""
    return next(name for name, form in GELU_APPROXIMATE.items() if form == approximate)


def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    out: torch.Tensor | None = None,
    prenorm: PreNorm | None = None,
    fp8_out: bool = False,
) -> torch.Tensor | Fp8Activation:
    """activation(PreNorm(x) @ weight^T + bias): a linear layer with what precedes and follows
    it in the model (prenorm None: x as it is).

    x `[M, K]`, weight `[N, K]` (nn.Linear layout), bias `[N]` or None. `activation` is "none",
    "gelu" (erf, BERT), "gelu_tanh" (GPT-2's "gelu_new"), "relu2" (relu(h)^2: Nemotron, Arcee), "relu" (OPT) or
    a gated one (GATED_ACTIVATIONS:
    "silu_mul", Llama's SwiGLU, "gelu_tanh_mul", Gemma's GeGLU, "gelu_mul", ModernBERT's
    GeGLU with the exact GELU, or "swiglu_oai", gpt-oss's clamped SwiGLU: weight is `[gate; up]`,
    `[2I, K]`, and the result `[M, I]` is act(gate, up), see `gated_act`). A kernel computes
    the activation on the GEMM's fp32 accumulator; here the linear's output is rounded to x's
    dtype first, as the unfused ops do.

    FP8 chains (kernels/fp8.py): x may be an Fp8Activation (a previous linear's `fp8_out`; an
    FP8 weight, no prenorm): its quantised rows are the GEMM's operand as they are. `fp8_out`:
    where `fp8_out_applies`, the result is act_quantize_rows_fp8 of the linear's output instead
    (`out` unused), for the next FP8 linear to take as x; elsewhere the flag changes nothing."""
    if activation not in LINEAR_ACTIVATIONS:
        raise ValueError(f"activation must be one of {LINEAR_ACTIVATIONS}, got {activation!r}")
    if isinstance(x, Fp8Activation):
        if not isinstance(weight, Fp8Weight) or prenorm is not None:
            raise ValueError("an Fp8Activation is the operand of an FP8 weight's linear, without a prenorm")
        operand = x
    else:
        operand = apply_prenorm(x, prenorm, weight.dtype)
    h = fp8_linear(operand, weight, bias) if isinstance(weight, Fp8Weight) else F.linear(operand, weight, bias)
    if fp8_out and fp8_out_applies(weight, x.shape[0], activation):
        return act_quantize_rows_fp8(h, activation)
    if activation in GATED_ACTIVATIONS:
        h = gated_act(h, activation)
    elif activation == "relu2":
        h = torch.relu(h).square()
    elif activation == "relu":
        h = torch.relu(h)
    elif activation != "none":
        h = bias_gelu(h, None, GELU_APPROXIMATE[activation])
    return h if out is None else out.copy_(h)


def relative_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bias: torch.Tensor,
    max_seqlen: int | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional attention over packed sequences with a relative position bias (MPNet, T5-style
    encoders), no mask tensor.

    q, k, v: `[T, H, D]` (any strides along T and H); bias: `[H, 2R + 1]` (read as fp32), the bias
    of a relative distance clamped to [-R, R]. Within each sequence of cu_seqlens, query i and key
    j (indices within the sequence) score scale * q_i . k_j + bias[h, clamp(j - i, -R, R) + R],
    softmax over j, then the weighted sum of v. `scale` defaults to head_dim ** -0.5; `max_seqlen`
    is unused here (the kernel sizes its grid with it). Returns `[T, H, D]` (in `out` when given)."""
    if bias.dim() != 2 or bias.shape[0] != q.shape[1] or bias.shape[1] % 2 != 1:
        raise ValueError(f"bias must be [heads {q.shape[1]}, 2R + 1], got {list(bias.shape)}")
    reach = bias.shape[1] // 2
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    cu = cu_seqlens.tolist()
    bias = bias.float()
    for i in range(len(cu) - 1):
        n = cu[i + 1] - cu[i]
        if n == 0:
            continue
        qs, ks, vs = (t[cu[i] : cu[i + 1]].transpose(0, 1).float() for t in (q, k, v))
        pos = torch.arange(n, device=q.device)
        rel = (pos[None, :] - pos[:, None]).clamp(-reach, reach) + reach  # [query, key]
        s = qs @ ks.transpose(-1, -2) * scale + bias[:, rel]
        out[cu[i] : cu[i + 1]] = (torch.softmax(s, dim=-1) @ vs).transpose(0, 1).to(out.dtype)
    return out


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store this iteration's keys/values `[T, Hkv, D]` in a paged cache `[blocks, block_size,
    Hkv, D]`: token t goes to slot `slot_mapping[t]` = block * block_size + offset (int64)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqlens_k: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    max_seqlen_q: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """`varlen_attention` whose keys/values live in a paged cache (vLLM's layout).

    k_cache, v_cache: `[num_blocks, block_size, Hkv, D]`; block_tables: `[B, max_blocks]` int32,
    row i lists sequence i's blocks in order (entries past its length are ignored); seqlens_k:
    `[B]` int32, keys of sequence i (cached + this iteration's, already written). Queries are
    packed by `cu_seqlens_q` and aligned to the end of their keys as in `varlen_attention`.
    `window`, `softcap`, `sinks`, `chunk` and `alibi_slopes` as in `varlen_attention`. `num_splits` is a kernel
    tuning knob (split keys over programs); the reference ignores it.
    """
    block_size = k_cache.shape[1]
    lengths = seqlens_k.tolist()
    slots = [
        block_tables[i, : -(-n // block_size)].long()[:, None] * block_size
        + torch.arange(block_size, device=q.device)[None, :]
        for i, n in enumerate(lengths)
    ]
    index = torch.cat([s.reshape(-1)[:n] for s, n in zip(slots, lengths)]) if slots else None
    flat_k = k_cache.reshape(-1, *k_cache.shape[2:])
    flat_v = v_cache.reshape(-1, *v_cache.shape[2:])
    keys = flat_k[index] if index is not None else flat_k[:0]
    values = flat_v[index] if index is not None else flat_v[:0]
    cu_k = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=q.device)
    cu_k[1:] = torch.cumsum(seqlens_k.to(torch.int32), 0)
    return varlen_attention(q, keys, values, cu_seqlens_q, cu_k, causal, scale, max_seqlen_q, out, window, softcap,
                            sinks, chunk, alibi_slopes)


def qkv_to_cache(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_squares: torch.Tensor | None = None,
    norm_ranks: int = 1,
    v_norm: bool = False,
    v_from_k: bool = False,
) -> torch.Tensor:
    """A decoder layer's QKV epilogue: bias, split, rotary (when cos/sin are given) and the
    write of k and v into the paged cache (`write_kv`); returns q `[T, H, D]`.

    `q_norm` / `k_norm` (`[D]`, Qwen3 and Gemma 3): after the bias and the split, before rotary,
    every q (k) head is RMS-normalised over its D values with that weight (`rms_norm`: fp32
    statistics, the result rounded to qkv's dtype); v only with `v_norm`. A weight of the
    whole width, `[H * D]` (`[Hkv * D]` for k; OLMo 2's), normalises each token's q (k) over all
    its heads at once instead (`head_norm`).

    `norm_squares` (fp32 `[T, 2]`, with whole-width norms split over `norm_ranks` tensor-parallel
    ranks, each holding H and Hkv of the heads): each token's sums of squares of its q and of its
    k over every rank's heads (`qk_squares` of each rank, all-reduced), in place of this rank's
    own; the mean squares are over the whole width, `norm_ranks * H * D` (`* Hkv * D`).

    `v_norm` (Gemma 4): every v head RMS-normalised over its D values too, without a weight.
    `v_from_k` (Gemma 4's full layers with attention_k_eq_v; no bias): qkv holds q and k only,
    `[T, (H + Hkv) * D]`, and v is k as projected, before k's norm and rotary."""
    if v_from_k:
        k_cols = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
        qkv = torch.cat([qkv, k_cols], dim=1)
    if q_norm is None and k_norm is None:
        if cos is None:
            q, k, v = qkv_split(qkv, bias, num_heads, num_kv_heads, head_dim)
        else:
            q, k, v = qkv_split_rotary(qkv, bias, num_heads, num_kv_heads, head_dim, cos, sin)
    else:
        q, k, v = qkv_split(qkv, bias, num_heads, num_kv_heads, head_dim)

        def normed(heads, norm, column):
            if norm is None:
                return heads
            if norm_squares is None:
                return head_norm(heads, norm, norm_eps)
            rows = heads.reshape(heads.shape[0], -1)  # the whole width's mean square from every rank's sums
            return summed_rms_norm(rows, norm, norm_eps, norm_squares[:, column : column + 1],
                                   rows.shape[1] * norm_ranks).view(heads.shape)

        q, k = normed(q, q_norm, 0), normed(k, k_norm, 1)
        if cos is not None:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if v_norm:
        v = rms_norm(v, torch.ones(head_dim, dtype=v.dtype, device=v.device), norm_eps)[0]
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    return q


def summed_rms_norm(rows: torch.Tensor, weight: torch.Tensor, eps: float, squares: torch.Tensor,
                    width: int) -> torch.Tensor:
    """RMSNorm of `rows` `[T, n]` whose sums of squares over the whole width `width` are given
    (`squares` `[T, 1]`, every tensor-parallel rank's share summed): fp32 statistics, rounded once
    to the rows' dtype, as rms_norm."""
    mean = squares.float() / width
    return (rows.float() * torch.rsqrt(mean + eps) * weight.float()).to(rows.dtype)


def qk_squares(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Each token's sums of squares of its q heads and of its k heads, fp32 `[T, 2]`, of QKV
    projection rows `[T, (H + 2 * Hkv) * D]` (no bias): what a rank holding H and Hkv of the heads
    contributes to whole-width q / k norms split over tensor-parallel ranks (qkv_to_cache's
    `norm_squares`, once all-reduced)."""
    q_width, k_width = num_heads * head_dim, num_kv_heads * head_dim
    h = qkv[:, : q_width + k_width].float()
    return torch.stack([h[:, :q_width].pow(2).sum(-1), h[:, q_width:].pow(2).sum(-1)], dim=1)


def head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of heads `[T, H, D]`: each head over its D values with a `[D]` weight, or each
    token's H heads together with an `[H * D]` one (the two agree where H is 1)."""
    if weight.numel() == x.shape[-1]:
        return rms_norm(x, weight, eps)[0]
    if weight.numel() != x.shape[-1] * x.shape[-2]:
        raise ValueError(f"a head norm's weight is [D] or [H * D] for heads {list(x.shape[1:])}, "
                         f"got {list(weight.shape)}")
    return rms_norm(x.reshape(x.shape[0], -1), weight, eps)[0].view(x.shape)


@dataclass(frozen=True)
class PreNorm:
    """What a fused decoder linear does to its input before the GEMM (a pre-norm block's
    "residual add, then the next norm"): h = x + x_bias + residual in fp32, written
    (rounded) to `sum_out` when given, the next residual stream, then LayerNorm(h) with
    `weight` and `bias`, or RMSNorm(h) with `weight` when `bias` is None. `sum_out` must not
    overlap x or the residual.

    `x_norm` (RMSNorm prenorms only; Gemma 2/3's "sandwich" norm closing the block before):
    x + x_bias is first RMS-normalised with weight `x_norm` (same eps) and rounded to x's dtype
    (as Hugging Face rounds that norm's output), and that is what the residual is added to.
    Norm weights may be of another dtype than x (Gemma's 1 + w kept in fp32).

    `weight` None (with `x_norm`; a post-norm block's, OLMo 2's and EXAONE 4's: no norm before
    the linear, only the one closing the block before): h itself is the operand, no norm after
    the add.

    `normed_out` (`[M, K]`, x's dtype): the operand is written there too, rounded to x's dtype
    (a MoE block's input: the router's linear normalises it, the experts read it after).

    `sum_scale` (`[1]`, RMSNorm prenorms only; Gemma 4's `layer_scalar` closing the layer before):
    the sum h, rounded to x's dtype, times it, rounded again, is both the next residual stream
    (`sum_out`) and what the norm reads."""
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    x_bias: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    sum_out: torch.Tensor | None = None
    x_norm: torch.Tensor | None = None
    normed_out: torch.Tensor | None = None
    sum_scale: torch.Tensor | None = None

    def __post_init__(self):
        if (self.x_norm is not None or self.sum_scale is not None) and self.bias is not None:
            raise ValueError("PreNorm.x_norm and sum_scale go with an RMSNorm prenorm (bias None), not a LayerNorm")
        if self.weight is None and (self.x_norm is None or self.bias is not None):
            raise ValueError("a PreNorm without a norm weight adds the residual to x_norm's output: give x_norm")


def apply_prenorm(x: torch.Tensor, prenorm: PreNorm | None, dtype: torch.dtype) -> torch.Tensor:
    """The GEMM operand `[M, K]` in `dtype` of a PreNorm'd (or plain, prenorm None) input."""
    return x.to(dtype) if prenorm is None else prenormed(x, prenorm).to(dtype)


def prenormed(x: torch.Tensor, prenorm: PreNorm) -> torch.Tensor:
    """What a PreNorm'd linear reads (apply_prenorm), in x's dtype, as rows of their own; the
    residual sum written to prenorm.sum_out and the rows to prenorm.normed_out where given."""
    p = prenorm
    if p.bias is not None:
        normed = add_bias_residual_layer_norm(x, p.x_bias, p.residual, p.weight, p.bias, p.eps, sum_out=p.sum_out)
    else:
        h = x.float() if p.x_bias is None else x.float() + p.x_bias.float()
        if p.x_norm is not None:
            h = rms_norm(h, p.x_norm, p.eps)[0].to(x.dtype).float()
        if p.sum_scale is not None:  # the sum, rounded, times the scale, rounded: the residual stream and the input
            h = (h if p.residual is None else h + p.residual.float()).to(x.dtype)
            total = (h.float() * p.sum_scale.float()).to(x.dtype)
            total = total if p.sum_out is None else p.sum_out.copy_(total)
            normed = total if p.weight is None else rms_norm(total, p.weight, p.eps)[0].to(x.dtype)
        elif p.weight is None:  # the residual stream itself is the operand
            normed = add_residual(h.to(x.dtype), p.residual, p.sum_out)
        else:
            normed = rms_norm(h, p.weight, p.eps, p.residual, p.sum_out)[0].to(x.dtype)
    return normed if p.normed_out is None else p.normed_out.copy_(normed)


def add_residual(h: torch.Tensor, residual: torch.Tensor | None, sum_out: torch.Tensor | None) -> torch.Tensor:
    """h + residual (summed in fp32, rounded to h's dtype once), into `sum_out` where given: a
    post-norm block's next residual stream (PreNorm with weight None)."""
    total = h if residual is None else (h.float() + residual.float()).to(h.dtype)
    return total if sum_out is None else sum_out.copy_(total)


def prenorm_qkv_to_cache(
    x: torch.Tensor,
    prenorm: PreNorm | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """A decoder layer's attention input in one op: PreNorm(x), the QKV projection, then
    `qkv_to_cache` (bias, the q/k head norms, rotary, k and v into the paged cache); returns
    q `[T, H, D]`."""
    operand = apply_prenorm(x, prenorm, weight.dtype)
    qkv = fp8_linear(operand, weight, None) if isinstance(weight, Fp8Weight) else F.linear(operand, weight)
    return qkv_to_cache(qkv, bias, num_heads, num_kv_heads, head_dim, cos, sin, k_cache, v_cache, slot_mapping,
                        q_norm, k_norm, norm_eps)


def all_reduce_sum(inputs, out: torch.Tensor | None = None) -> torch.Tensor:
    """What a sum all-reduce leaves on every rank: the ranks' tensors (`inputs[r]` is rank r's,
    all of one shape and dtype) added in rank order in fp32 and rounded to their dtype once.
    Rank order makes the result the same bits on every rank (triton_allreduce.py sums so)."""
    acc = torch.zeros(inputs[0].shape, dtype=torch.float32, device=inputs[0].device)
    for x in inputs:
        acc += x.float()
    result = acc.to(inputs[0].dtype)
    return result if out is None else out.copy_(result)


def all_reduce_rms_norm(inputs, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        x_norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A sum all-reduce (all_reduce_sum of the ranks' `inputs`) followed by the next linear's
    PreNorm (RMSNorm with `weight` of the sum, post-normed with `x_norm` first where given, plus
    `residual`), as the unfused path computes them one after the other. Returns (normalised,
    the next residual stream), both in the inputs' dtype."""
    x = all_reduce_sum(inputs)
    sum_out = torch.empty_like(residual)
    normed = apply_prenorm(x, PreNorm(weight, None, eps, residual=residual, sum_out=sum_out, x_norm=x_norm), x.dtype)
    return normed, sum_out


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row) dynamic FP8 quantisation of activations `[M, K]`: (E4M3 values `[M, K]`,
    fp32 scales `[M, 1]`) with scale = max(amax(|row|), fp8.MIN_AMAX) / 448 and values =
    round-to-nearest(row / scale), computed in fp32."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=fp8.MIN_AMAX) / fp8.E4M3_MAX
    return (xf / scale).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(fp8.E4M3), scale


FP8_OUT_ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu2", "relu")  # act_quantize_rows_fp8's


def fp8_out_applies(weight, rows: int, activation: str) -> bool:
    """Whether linear_act with `fp8_out` returns an Fp8Activation: an FP8 weight past
    fp8.WEIGHT_ONLY_MAX_ROWS rows (fp8.quantizes_activations: its linear quantises activations
    per token anyway, and so will the next one's on the same rows) and an activation of
    FP8_OUT_ACTIVATIONS (not a gated one)."""
    return fp8.quantizes_activations(weight, rows) and activation in FP8_OUT_ACTIVATIONS


def act_quantize_rows_fp8(h: torch.Tensor, activation: str = "none") -> Fp8Activation:
    """activation(h) quantised per token, for the next FP8 linear (an FFN's down projection): h
    `[M, N]` is the up projection's output with its bias already added (the GEMM's epilogue);
    the activation (FP8_OUT_ACTIVATIONS: linear_act's names) is computed in fp32 on h and
    rounded to h's dtype, as the unfused path's activation pass writes it (bias_gelu's kernel,
    the ReLUs), and that is what `quantize_rows_fp8` quantises: the same values and scales as
    the activation and the next linear's quantisation run one after the other. The kernel
    never writes the rounded activation; it rounds in registers."""
    if activation not in FP8_OUT_ACTIVATIONS:
        raise ValueError(f"activation must be one of {FP8_OUT_ACTIVATIONS}, got {activation!r}")
    if activation in GELU_APPROXIMATE:
        h = bias_gelu(h, None, GELU_APPROXIMATE[activation])
    elif activation != "none":
        h = torch.relu(h).square() if activation == "relu2" else torch.relu(h)
    q, scale = quantize_rows_fp8(h)
    return Fp8Activation(q, scale, h.dtype)


def fp8_linear(x: torch.Tensor | Fp8Activation, weight: Fp8Weight,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x `[M, K]` @ W^T + bias for an FP8 weight, in the activation dtype `weight.dtype`, as the
    GPU computes it (kernels/fp8.py):

    * up to fp8.WEIGHT_ONLY_MAX_ROWS rows, weight-only: x as it is times the E4M3 values in
      fp32, each column times its weight scale, plus the bias, rounded once (the GEMV and the
      small GEMM apply the scale and bias on their fp32 accumulator);
    * more rows: x quantised per token (`quantize_rows_fp8`), the E4M3 product in fp32 times
      both scales plus the bias, rounded once (torch._scaled_mm's output, the bias in its epilogue).
      An Fp8Activation x (more rows only) is that quantised x already.

    The weight is dequantised on every call: fine for the tests and the CPU, which this serves."""
    w = weight.data.float()
    if isinstance(x, Fp8Activation):
        if x.shape[0] <= fp8.WEIGHT_ONLY_MAX_ROWS:
            raise ValueError(f"an Fp8Activation of {x.shape[0]} rows: up to fp8.WEIGHT_ONLY_MAX_ROWS = "
                             f"{fp8.WEIGHT_ONLY_MAX_ROWS} an FP8 linear reads its activation 16-bit")
        q, scale = x.q, x.scale
    elif x.shape[0] <= fp8.WEIGHT_ONLY_MAX_ROWS:
        h = F.linear(x.float(), w) * weight.scale
        return (h if bias is None else h + bias.float()).to(weight.dtype)
    else:
        q, scale = quantize_rows_fp8(x)
    h = F.linear(q.float(), w) * scale * weight.scale
    return (h if bias is None else h + bias.float()).to(weight.dtype)


MOE_SCORINGS = ("softmax", "sigmoid", "sparsemixer")
MOE_GROUP_SCORES = ("top2_sum", "max")


def check_moe_scoring(scoring: str) -> None:
    if scoring not in MOE_SCORINGS:
        raise ValueError(f"unknown MoE scoring {scoring!r} (supported: {', '.join(MOE_SCORINGS)})")


def moe_grouped(num_experts: int, top_k: int, groups: int, kept_groups: int, group_score: str) -> bool:
    """Whether routing over `num_experts` is group-limited (`groups` > `kept_groups`: only the
    best kept_groups of the groups are chosen from), after checking that such a routing can be
    done: the experts split into `groups` equal groups, 1 <= kept_groups, the kept groups hold
    at least `top_k` experts, and `group_score` is one of MOE_GROUP_SCORES (`top2_sum` needs
    two experts a group)."""
    if groups <= kept_groups:
        return False
    if group_score not in MOE_GROUP_SCORES:
        raise ValueError(f"unknown MoE group score {group_score!r} (supported: {', '.join(MOE_GROUP_SCORES)})")
    size = num_experts // groups if groups > 0 else 0
    if kept_groups < 1 or size * groups != num_experts or (group_score == "top2_sum" and size < 2):
        raise ValueError(f"group-limited routing needs the {num_experts} experts in equal groups (n_group {groups}, "
                         f"of {'two or more' if group_score == 'top2_sum' else 'one or more'} experts) and "
                         f"topk_group ({kept_groups}) >= 1")
    if top_k > kept_groups * size:
        raise ValueError(f"num_experts_per_tok ({top_k}) is more than the kept groups' experts "
                         f"(topk_group {kept_groups} x {size})")
    return True


def moe_route(router_logits: torch.Tensor, top_k: int, normalize: bool,
              weights_dtype: torch.dtype | None = None, scoring: str = "softmax",
              score_bias: torch.Tensor | None = None, scale: float = 1.0, groups: int = 1, kept_groups: int = 1,
              group_score: str = "top2_sum", mask_eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of a mixture-of-experts layer over the experts' logits `[T, E]`, in fp32.
    Returns (weights `[T, k]` fp32, expert ids `[T, k]` int64).

    `softmax` (Mixtral, Qwen MoE, Granite MoE): the k largest probabilities, renormalised to sum
    to 1 where `normalize` (Mixtral; Qwen's `norm_topk_prob`); with `score_bias` (ERNIE 4.5's)
    the k of the largest probability + bias, weighted by their probabilities. `sigmoid` (GLM-4.5, DeepSeek-V3's
    scoring): each expert's score is sigmoid(logit); the k experts of the largest score +
    `score_bias` (`[E]`, the checkpoint's `e_score_correction_bias`; it only chooses) are taken
    with their scores as weights, renormalised where `normalize` (over their sum + 1e-20).
    Either way the weights are then multiplied by `scale` (`routed_scaling_factor`) and rounded
    to `weights_dtype` where given (Qwen's and Granite's routers round them to the logits'
    dtype, Mixtral's keep fp32).

    Group-limited choice, where `groups` > `kept_groups` (the config's `n_group` and
    `topk_group`; moe_grouped checks them): the experts are `groups` equal runs of consecutive
    ids; each group is scored from the values that choose (score, or score + bias) by
    `group_score`: `top2_sum`, the sum of its two largest (DeepSeek-V3's `noaux_tc`, GLM-4.5),
    or `max`, its largest (DeepSeek-V2's `group_limited_greedy`); the k experts are chosen only
    among the `kept_groups` best groups'. Their weights are then as above.

    `sparsemixer` (Phi-3.5-MoE's router at inference): the k experts are taken one at a time, the
    j-th the largest logit m_j of those not yet taken, weighted by a softmax of the logits over
    only the experts not yet taken whose logit s is near it, (m_j - s) / max(|s|, m_j) <= 2 *
    `mask_eps` (the config's `router_jitter_noise`; a 0 / 0 counts as near): w_j = 1 / sum of
    exp(s - m_j) over those. No renormalisation, bias or groups (the family passes none)."""
    check_moe_scoring(scoring)
    logits = router_logits.float()
    if scoring == "sparsemixer":
        return _sparsemixer_route(logits, top_k, weights_dtype, scale, mask_eps)
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    choice = scores if score_bias is None else scores + score_bias.float()
    if moe_grouped(logits.shape[1], top_k, groups, kept_groups, group_score):
        by_group = choice.view(choice.shape[0], groups, -1)
        ranked = by_group.topk(2 if group_score == "top2_sum" else 1, dim=-1).values.sum(dim=-1)  # [T, groups]
        kept = torch.zeros_like(ranked, dtype=torch.bool).scatter_(1, ranked.topk(kept_groups, dim=-1).indices, True)
        choice = by_group.masked_fill(~kept[..., None], float("-inf")).view_as(choice)
    ids = torch.topk(choice, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if normalize:
        total = weights.sum(dim=-1, keepdim=True)
        weights = weights / (total if scoring == "softmax" else total + 1e-20)
    if scale != 1.0:
        weights = weights * scale
    if weights_dtype is not None:
        weights = weights.to(weights_dtype).float()
    return weights, ids


def _sparsemixer_route(logits: torch.Tensor, top_k: int, weights_dtype: torch.dtype | None, scale: float,
                       mask_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_route's `sparsemixer` of fp32 `logits` `[T, E]`."""
    left = logits.clone()  # the experts not yet taken (-inf: taken)
    weights, ids = [], []
    for _ in range(top_k):
        best, pick = left.max(dim=-1, keepdim=True)
        far = (best - logits) / logits.abs().clamp(min=best) > 2 * mask_eps  # (NaN, 0 / 0: not far)
        near = torch.exp(left - best).masked_fill(far, 0.0)
        weights.append(1.0 / near.sum(dim=-1, keepdim=True))  # (exp(m - m) over the sum)
        ids.append(pick)
        left = left.scatter(1, pick, float("-inf"))
    weights = torch.cat(weights, dim=-1) * scale
    if weights_dtype is not None:
        weights = weights.to(weights_dtype).float()
    return weights, torch.cat(ids, dim=-1)


def moe_mlp(x: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
            normalize: bool, weights_dtype: torch.dtype | None = None, activation: str = "silu_mul",
            scoring: str = "softmax", score_bias: torch.Tensor | None = None, scale: float = 1.0,
            gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None, groups: int = 1,
            kept_groups: int = 1, group_score: str = "top2_sum", mask_eps: float = 0.0,
            identity_experts: int = 0) -> torch.Tensor:
    """A mixture-of-experts MLP over x `[T, H]`: each token routed by its `router_logits` `[T, E]`
    (moe_route: top_k, normalize, weights_dtype, scoring, score_bias, scale, the group-limited
    choice's groups, kept_groups, group_score, and sparsemixer's mask_eps), then the sum over its k experts of
    weight * expert(x), an expert e a gated MLP:
    down[e] @ act(gate_up[e] @ x + gate_up_bias[e]) + down_bias[e], with gate_up `[E, 2I, H]`
    ([gate; up], `activation` as linear_act's gated ones) or, for a plain activation (Nemotron-H's
    "relu2"), the up projection `[E, I, H]` alone, down `[E, H, I]` and the optional
    biases (gpt-oss's experts have them) gate_up_bias `[E, 2I]` ([gate; up]) and down_bias
    `[E, H]`; the routing weight multiplies the biased output. Each expert runs once over its
    tokens (as Hugging Face's loop does); the weighted rows are summed in fp32 and rounded once.

    `identity_experts` Z > 0 (LongCat-Flash's zero-computation experts): the logits are `[T, E + Z]`, the
    last Z ids routed to as any other, each of them the identity (weight * x, no weights of its own): gate_up
    and down hold the E experts that compute."""
    if router_logits.shape[1] != gate_up.shape[0] + identity_experts:
        raise ValueError(f"{router_logits.shape[1]} router logits for {gate_up.shape[0]} experts and "
                         f"{identity_experts} identity experts")
    weights, ids = moe_route(router_logits, top_k, normalize, weights_dtype, scoring, score_bias, scale, groups,
                             kept_groups, group_score, mask_eps)
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)
        if e >= gate_up.shape[0]:  # an identity expert: the rows as they are
            out.index_add_(0, token, x[token].float() * weights[token, slot, None])
            continue
        h = linear_act(x[token], gate_up[e], None if gate_up_bias is None else gate_up_bias[e], activation)
        y = F.linear(h, down[e], None if down_bias is None else down_bias[e])
        out.index_add_(0, token, y.float() * weights[token, slot, None])
    return out.to(x.dtype)


def moe_max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks the sorted pairs can need: each expert's run rounds up to a whole block."""
    return -(-pairs // block_m) + min(num_experts, pairs)


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The routed pairs of `ids` ([T, k] expert ids; pair p = t * k + slot) grouped by expert:
    (pairs [blocks * block_m]: pair ids, expert by expert, each expert's run padded to a
    multiple of block_m with the sentinel T * k; experts [blocks]: each block's expert, -1 for
    the unused blocks at the end). `blocks` is an upper bound fixed by the shape
    (ceil(T * k / block_m) + min(E, T * k)), so nothing here waits for the GPU."""
    flat = ids.reshape(-1).long()
    pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks, 0)
    n_blocks = moe_max_blocks(pairs, num_experts, block_m)
    order = torch.sort(flat, stable=True).indices  # the pairs, expert by expert, in pair order inside one
    expert = flat[order]
    rank = torch.arange(pairs, device=ids.device) - (torch.cumsum(counts, 0) - counts)[expert]
    dest = (block_end - blocks)[expert] * block_m + rank
    sorted_pairs = torch.full((n_blocks * block_m,), pairs, dtype=torch.int32, device=ids.device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    owner = torch.searchsorted(block_end, torch.arange(n_blocks, device=ids.device), right=True)
    experts = torch.where(owner < num_experts, owner, -1).to(torch.int32)
    return sorted_pairs, experts


def moe_route_align(router_logits: torch.Tensor, top_k: int, normalize: bool, weights_dtype: torch.dtype | None,
                    block_m: int, scoring: str = "softmax", score_bias: torch.Tensor | None = None,
                    scale: float = 1.0, groups: int = 1, kept_groups: int = 1,
                    group_score: str = "top2_sum",
                    mask_eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_route, then moe_align of its ids: (weights `[T, k]` fp32, pairs, experts), what the
    expert GEMMs read (kernels/triton_moe.py)."""
    weights, ids = moe_route(router_logits, top_k, normalize, weights_dtype, scoring, score_bias, scale, groups,
                             kept_groups, group_score, mask_eps)
    return (weights, *moe_align(ids, router_logits.shape[1], block_m))


WKV4_FRESH_MAX = -1e30  # RWKV-4's starting max exponent (transformers' state[4] -= 1e30): e^(FRESH - m) is 0


def wkv4_step(k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, w: torch.Tensor, num: torch.Tensor,
              den: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One token of RWKV-4's WKV for rows of channels: k fp32, v (any float dtype), u = time_first and
    w = -exp(time_decay) fp32, the state num / den / top (the largest exponent) fp32. Returns (wkv fp32, num, den,
    top) after the token, in transformers' order of operations."""
    m = torch.maximum(top, k + u)
    e1, e2 = torch.exp(top - m), torch.exp(k + u - m)
    out = (e1 * num + e2 * v) / (e1 * den + e2)
    m = torch.maximum(top + w, k)
    e1, e2 = torch.exp(top + w - m), torch.exp(k - m)
    return out, e1 * num + e2 * v, e1 * den + e2, m


def wkv4(k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, w: torch.Tensor, num: torch.Tensor, den: torch.Tensor,
         top: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor | None = None) -> torch.Tensor:
    """RWKV-4's WKV (models/rwkv.py) over consecutive sequences of rows: k `[T, H]` fp32, v `[T, H]` (any float
    dtype), u = time_first and w = -exp(time_decay) `[H]` fp32; sequence s is rows sum(lens[:s]) .. + lens[s] (lens
    None: each row a sequence of its own), its state num / den / top `[slots, H]` fp32 at row slots[s], read (a slot
    whose den is 0, never written since it was zeroed, starts top at WKV4_FRESH_MAX), carried token by token and
    written back in place. Returns wkv `[T, H]` fp32."""
    out = torch.empty_like(k)
    if lens is None:  # one step of every row together
        s_den = den[slots]
        s_top = torch.where(s_den == 0, WKV4_FRESH_MAX, top[slots])
        out, n2, d2, t2 = wkv4_step(k, v, u, w, num[slots], s_den, s_top)
        num.index_copy_(0, slots, n2)
        den.index_copy_(0, slots, d2)
        top.index_copy_(0, slots, t2)
        return out
    row = 0
    for s, n in enumerate(lens.tolist()):
        at = slots[s : s + 1]
        s_num, s_den = num[at], den[at]
        s_top = torch.where(s_den == 0, WKV4_FRESH_MAX, top[at])
        for t in range(row, row + n):
            out[t : t + 1], s_num, s_den, s_top = wkv4_step(k[t : t + 1], v[t : t + 1], u, w, s_num, s_den, s_top)
        num.index_copy_(0, at, s_num)
        den.index_copy_(0, at, s_den)
        top.index_copy_(0, at, s_top)
        row += n
    return out


def mlstm_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor,
                 c: torch.Tensor, n: torch.Tensor, m: torch.Tensor, slots: torch.Tensor, eps: float) -> torch.Tensor:
    """One token of the mLSTM rule (models/mlstm.py) for each of B decoding sequences: q, k `[B, H, dk]`, v
    `[B, H, dv]`, the (capped) gate logits i, f `[B, H]`, all in the model's dtype; the states C `[slots, H, dk, dv]`,
    n `[slots, H, dk]`, m `[slots, H, 1]` fp32, row b's at slots[b], read and written back in place. Returns h
    `[B, H, dv]` in the model's dtype, rounded where transformers' step rounds (the outer product k v^T and the
    products with C and n in the model's dtype)."""
    dtype = q.dtype
    c0, n0, m0 = c.index_select(0, slots), n.index_select(0, slots), m.index_select(0, slots)
    f_log = F.logsigmoid(f)[..., None]  # [B, H, 1]
    m1 = torch.max(f_log + m0, i[..., None])
    f_act = torch.exp(f_log + m0 - m1)
    i_act = torch.exp(i[..., None] - m1)
    q = q * (q.shape[-1] ** -0.5)
    c1 = f_act[..., None] * c0 + i_act[..., None] * (k[..., :, None] @ v[..., None, :])
    n1 = f_act * n0 + i_act * k
    num = (q[..., None, :] @ c1.to(dtype)).squeeze(-2).float()
    qn = (q[..., None, :] @ n1[..., None].to(dtype)).squeeze(-2)
    den = (torch.maximum(qn.abs(), torch.exp(-m1)) + eps).float()
    c.index_copy_(0, slots, c1.float())
    n.index_copy_(0, slots, n1.float())
    m.index_copy_(0, slots, m1.float())
    return (num / den).to(dtype)
