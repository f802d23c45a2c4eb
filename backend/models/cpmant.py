"""CPM-Ant (`cpmant`: OpenBMB's CPM-Ant, openbmb/cpm-ant-10b): pre-norm blocks of RMSNorm (`layernorm_before_attention`,
`layernorm_before_ffn`, `output_layernorm` at the end; x * rsqrt(mean(x^2) + eps) in fp32, cast, then * w), unbiased
q / k / v / out projections (`project_q`, `project_k`, `project_v`, `attention_out`) of `dim_head`-wide heads, a
gated GELU (erf) MLP `dim_ff` wide (gelu(w_0 x) * w_1 x, then w_out), no rotary, no position table. The head
(`lm_head`) is a weight of its own: the input table is longer than the vocabulary (below).

What transformers' CpmAntForCausalLM computes for a token prompt, and so what is served:
- `prompt_length` (P) virtual tokens go first, ids vocab + 2P .. vocab + 3P - 1 of `input_embedding` (which holds
  vocab + prompt_types * P rows), segment 0; each text token is segment 2, or 0 where its id is 0 (transformers
  reads id 0 as padding). Every row adds `segment_embedding[segment]`.
- Attention adds a per-head bias `relative_attention_bias` [segment_types^2 + buckets, heads]: within one segment
  the row of the T5 bidirectional bucket of key-minus-query position (bert.relative_bucket: half the buckets a
  direction, a quarter exact, log-spaced up to `position_bias_max_distance`), across segments the row
  buckets + q_segment * segment_types + k_segment. Positions count the virtual tokens (text token t is at P + t).
- The first forward (the prompt) attends both ways: the virtual tokens and every prompt token see one another.
  Each later token runs alone against the cache, so generated tokens see everything before them and nothing after.
- Padding: with z ids of 0 among the text so far, the first z text tokens are masked as keys, and as queries (a
  masked query's attention output is 0); the virtual tokens never are. (A prompt of left padding; applied as
  transformers applies it, wherever the zeros are.)

So the prompt must run in one forward: the family sets `whole_prompts`, under which the scheduler never chunks a
prompt (nor a preempted sequence's recompute), and a chunk that starts past 0 is an error naming it. A recompute (prompt and output in one forward) attends both ways over the prompt and
causally after it, from the engine's BatchEntry.prompt_len (unknown, 0: the whole first forward is the prompt).

Per sequence (a StateCache slot, decoder/state_cache.py, fp32; taken and reset as a hybrid's recurrent state is, so
prefix caching and shared fork blocks are off): the virtual tokens' keys and values of every layer, which depend on
the prompt, and a map of which text positions hold id 0 (the segments and the padding mask of later tokens).

The attention runs in PyTorch ops (the segment bias is no function of distance alone, which the relative-bias kernel
needs): one batched pass for the decode rows (no host sync), per prompt for the first forwards; no decode graphs
(`decode_graphs`: see CpmAnt). Linears, norms and the MLP too. `max_position_embeddings`: position_bias_max_distance - prompt_length text
tokens (the config's longest sequence, virtual tokens included).

Refused by name: `use_cache` false (transformers' generate then runs every step over the whole sequence both ways,
another computation), fewer than 3 `prompt_types` or `segment_types` (the virtual ids and segment 2 would not exist),
fewer than 4 `position_bias_num_buckets`; tensor parallelism and FP8 (decoder.py: the spec is not the shared
decoder's)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.bert import relative_bias_by_distance
from tritonformer.backend.models.decoder import DecoderModel, eos_ids

TEXT_SEGMENT = 2  # (a token of id 0 is segment 0, as the virtual tokens are)


@dataclass(frozen=True)
class CpmAntSpec:
    vocab_size: int
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    num_layers: int
    eps: float
    num_buckets: int
    max_distance: int
    prompt_types: int
    prompt_length: int
    segment_types: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]

    norm_offset = 0.0  # (RMSNorm's weight as it is: model_shapes.random_decoder draws it around 1)

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, as the model reads them (model_shapes.random_decoder)."""
        hidden, inner, ff = self.hidden_size, self.num_heads * self.head_dim, self.intermediate_size
        shapes = {"input_embedding.weight": (self.vocab_size + self.prompt_types * self.prompt_length, hidden),
                  "segment_embedding.weight": (self.segment_types, hidden),
                  "position_bias.relative_attention_bias": (self.segment_types ** 2 + self.num_buckets,
                                                            self.num_heads),
                  "encoder.output_layernorm.weight": (hidden,), "lm_head.weight": (self.vocab_size, hidden)}
        for i in range(self.num_layers):
            att, ffn = f"encoder.layers.{i}.self_att.", f"encoder.layers.{i}.ffn."
            shapes.update({att + "layernorm_before_attention.weight": (hidden,),
                           **{att + f"self_attention.project_{n}.weight": (inner, hidden) for n in "qkv"},
                           att + "self_attention.attention_out.weight": (hidden, inner),
                           ffn + "layernorm_before_ffn.weight": (hidden,), ffn + "ffn.w_in.w_0.weight": (ff, hidden),
                           ffn + "ffn.w_in.w_1.weight": (ff, hidden), ffn + "ffn.w_out.weight": (hidden, ff)})
        return shapes


def from_hf(cfg: dict) -> CpmAntSpec:
    if cfg.get("use_cache", True) is False:
        raise ValueError("CPM-Ant with use_cache false is not supported (transformers' generate then attends both "
                         "ways over the whole sequence every step; supported: use_cache true)")
    prompt_types, segment_types = cfg.get("prompt_types", 32), cfg.get("segment_types", 32)
    buckets, prompt_length = cfg.get("position_bias_num_buckets", 512), cfg.get("prompt_length", 32)
    if prompt_types < 3:
        raise ValueError(f"CPM-Ant with prompt_types {prompt_types} is not supported (supported: prompt_types >= 3, "
                         f"the prompt's virtual tokens being of type 2)")
    if segment_types < 3:
        raise ValueError(f"CPM-Ant with segment_types {segment_types} is not supported (supported: segment_types "
                         f">= 3, text being segment 2)")
    if buckets < 4:
        raise ValueError(f"CPM-Ant with position_bias_num_buckets {buckets} is not supported (supported: "
                         f"position_bias_num_buckets >= 4)")
    max_distance = cfg.get("position_bias_max_distance", 2048)
    return CpmAntSpec(
        vocab_size=cfg.get("vocab_size", 30720), hidden_size=cfg.get("hidden_size", 4096),
        num_heads=cfg.get("num_attention_heads", 32), head_dim=cfg.get("dim_head", 128),
        intermediate_size=cfg.get("dim_ff", 10240), num_layers=cfg.get("num_hidden_layers", 48),
        eps=cfg.get("eps", 1e-6), num_buckets=buckets, max_distance=max_distance, prompt_types=prompt_types,
        prompt_length=prompt_length, segment_types=segment_types,
        max_position_embeddings=max(2, max_distance - prompt_length), eos_token_ids=eos_ids(cfg))


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The published tensors under `cpmant.` (transformers' names) as the model reads them."""
    return cfg, {(k[len("cpmant."):] if k.startswith("cpmant.") else k): v for k, v in state.items()}


class CpmAnt(DecoderModel):
    whole_prompts = True  # (the prompt attends both ways: see the module docstring)
    # Its decode attention (PyTorch ops) gathers each row's whole block table: captured at the longest sequence's
    # table for 256 rows, the graphs' pools took 36 GB on an H200 and the benchmark ran out of memory; eager, a step
    # gathers the batch's tables only as wide as its longest sequence.
    decode_graphs = False

    def __init__(self, config: CpmAntSpec, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 tp=None):
        if tp is not None:
            raise ValueError("tensor parallelism is not supported for model_type 'cpmant'")
        super().__init__(config, state, device, dtype)
        c, w = config, self.weight
        p = c.prompt_length
        table = w("input_embedding.weight")
        rows = c.vocab_size + c.prompt_types * p
        if table.shape != (rows, c.hidden_size):
            raise ValueError(f"input_embedding.weight is {list(table.shape)}, the config says [{rows}, "
                             f"{c.hidden_size}] (vocab_size + prompt_types * prompt_length rows)")
        self.embed = table
        self.segments = w("segment_embedding.weight")
        # The virtual tokens' rows, the same for every prompt: ids vocab + 2P .. vocab + 3P - 1, segment 0.
        self.virtual = table[c.vocab_size + 2 * p: c.vocab_size + 3 * p] + self.segments[0]
        bias = w("position_bias.relative_attention_bias").float()  # (as transformers holds it, in the model's dtype)
        self.distance_bias = relative_bias_by_distance(bias[: c.num_buckets], c.num_buckets,
                                                       c.max_distance).t().contiguous()  # [2R + 1, heads]
        text = torch.tensor([0, TEXT_SEGMENT], device=device)  # (segment of "not text" and of text)
        self.segment_bias = bias[c.num_buckets + text[:, None] * c.segment_types + text[None, :]]  # [2, 2, heads]
        self.layers = []
        for i in range(c.num_layers):
            pre = f"encoder.layers.{i}."
            att, ffn = pre + "self_att.", pre + "ffn."
            # (under the shared decoder's layer field names, which the benchmark's byte and FLOP counts read)
            self.layers.append(SimpleNamespace(
                attn_norm=w(att + "layernorm_before_attention.weight"),
                qkv_w=torch.cat([w(att + f"self_attention.project_{n}.weight") for n in "qkv"]),
                o_w=w(att + "self_attention.attention_out.weight"),
                mlp_norm=w(ffn + "layernorm_before_ffn.weight"),
                gate_up_w=torch.cat([w(ffn + "ffn.w_in.w_0.weight"), w(ffn + "ffn.w_in.w_1.weight")]),
                down_w=w(ffn + "ffn.w_out.weight"),
            ))
        self.final_norm = w("encoder.output_layernorm.weight")
        self.set_output_head(w("lm_head.weight"))

    def new_state_cache(self, num_slots: int) -> StateCache:
        c = self.config
        shape = (c.num_layers, c.prompt_length, c.num_heads, c.head_dim)
        return StateCache([{"keys": shape, "values": shape, "zeros": (c.max_position_embeddings,)}], num_slots,
                          self.device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.config.eps)).to(x.dtype) * weight

    def _bias(self, q_pos, q_text, k_pos, k_text) -> torch.Tensor:
        """`[..., heads]` fp32 for broadcastable query / key positions (virtual tokens counted) and
        whether each is segment 2."""
        reach = self.config.max_distance
        same = (q_text == k_text)[..., None]
        by_distance = self.distance_bias[(k_pos - q_pos).clamp(-reach, reach) + reach]
        return torch.where(same, by_distance, self.segment_bias[q_text.long(), k_text.long()])

    def _attend(self, q, k, v, bias, mask) -> torch.Tensor:
        """q `[..., Q, H, D]`, k / v `[..., K, H, D]`, bias `[..., Q, K, H]`, mask `[..., Q, K]` (a row with
        nothing visible gets 0, as transformers fills it)."""
        scores = torch.einsum("...qhd,...khd->...hqk", q.float(), k.float()) / math.sqrt(self.config.head_dim)
        scores = scores + bias.movedim(-1, -3)
        hidden = ~mask.unsqueeze(-3)
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1).masked_fill(hidden, 0.0)
        # (keys no query sees may be cache slots never written: their values, NaN or not, kept out of the sum)
        v = v.float().masked_fill(~mask.any(-2)[..., None, None], 0.0)
        return torch.einsum("...hqk,...khd->...qhd", probs, v).to(q.dtype)

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        c, P = self.config, self.config.prompt_length
        H, D = c.num_heads, c.head_dim
        ids, rows = batch.input_ids, batch.input_ids.shape[0]
        state = cache.state.layer(0)
        # Each entry's first row, start and prompt length (the host's: this model runs no decode graphs).
        starts = batch.entry_starts
        lens = (1,) * batch.num_decode + tuple(batch.prefill_lens)
        firsts = [0]
        for n in lens[:-1]:
            firsts.append(firsts[-1] + n)
        fresh = [i for i, s in enumerate(starts) if s == 0]
        for i, s in enumerate(starts):
            if s > 0 and lens[i] > 1:
                raise ValueError(f"a CPM-Ant prompt chunk starting at token {s}: the prompt attends both ways and "
                                 f"must run in one forward (the engine schedules it whole: whole_prompts)")
        decode = [i for i in range(batch.num_decode) if not starts or starts[i] > 0]
        row_slots = batch.state_slots if batch.num_decode == len(lens) else torch.repeat_interleave(
            batch.state_slots, torch.tensor(lens, device=self.device), output_size=rows)
        pos = batch.positions
        is_text = ids != 0
        state["zeros"][row_slots, pos.clamp(max=c.max_position_embeddings - 1)] = (~is_text).float()
        # Text tokens masked as padding for row r: the first z_r, z_r the zeros among tokens 0 .. max(r, prompt end)
        prompt_ends = [0] * len(lens)
        for i in fresh:
            prompt_ends[i] = (batch.prompt_lens[i] if batch.prompt_lens else 0) or lens[i]
            if prompt_ends[i] > lens[i]:
                raise ValueError(f"a CPM-Ant prompt of {prompt_ends[i]} tokens in a first chunk of {lens[i]}: the "
                                 f"prompt attends both ways and must run in one forward (whole_prompts)")
        limit = pos.clone()
        for i in fresh:
            limit[firsts[i]: firsts[i] + lens[i]].clamp_(min=prompt_ends[i] - 1)
        cols = torch.arange(c.max_position_embeddings, device=self.device)
        zeros = (state["zeros"][row_slots] * (cols[None, :] <= limit[:, None])).sum(-1).long()  # [rows]

        h = self.embed[ids] + self.segments[torch.where(is_text, TEXT_SEGMENT, 0)]
        if fresh:
            h = torch.cat([h, self.virtual.repeat(len(fresh), 1)])
        dec = torch.tensor(decode, device=self.device) if len(decode) != batch.num_decode else None
        for li, layer in enumerate(self.layers):
            x = self._norm(h, layer.attn_norm)
            q, k, v = F.linear(x, layer.qkv_w).view(-1, 3, H, D).unbind(1)
            kc, vc = cache.keys(li), cache.values(li)
            kc.view(-1, H, D)[batch.slot_mapping] = k[:rows]
            vc.view(-1, H, D)[batch.slot_mapping] = v[:rows]
            ctx = torch.zeros_like(q)
            if decode:
                ctx[: batch.num_decode] = self._decode_attention(batch, li, q, kc, vc, state, row_slots, zeros, dec,
                                                                 ctx[: batch.num_decode])
            for j, i in enumerate(fresh):
                lo, n, virtual = firsts[i], lens[i], slice(rows + j * P, rows + (j + 1) * P)
                slot = row_slots[lo]
                state["keys"][slot, li] = k[virtual].float()
                state["values"][slot, li] = v[virtual].float()
                qs = torch.cat([q[virtual], q[lo: lo + n]])
                ks, vs = torch.cat([k[virtual], k[lo: lo + n]]), torch.cat([v[virtual], v[lo: lo + n]])
                out = self._prompt_attention(qs, ks, vs, is_text[lo: lo + n], zeros[lo: lo + n], prompt_ends[i])
                ctx[virtual], ctx[lo: lo + n] = out[:P], out[P:]
            h = h + F.linear(ctx.reshape(-1, H * D), layer.o_w)
            x = self._norm(h, layer.mlp_norm)
            gate, up = F.linear(x, layer.gate_up_w).chunk(2, -1)
            h = h + F.linear(F.gelu(gate) * up, layer.down_w)
        h = h[:rows]
        if not batch.logits_every_row:
            h = h[batch.logits_index]
        return self.logits(self._norm(h, self.final_norm), fp32_logits)

    def _prompt_attention(self, q, k, v, is_text, zeros, prompt_end: int) -> torch.Tensor:
        """One sequence's first forward: its P virtual tokens then n text tokens (q / k / v `[P + n, H, D]`).
        Text tokens 0 .. prompt_end - 1 and the virtual ones attend both ways, later ones causally."""
        P, device = self.config.prompt_length, q.device
        n = is_text.numel()
        t = torch.arange(n, device=device)
        q_pos = torch.arange(P + n, device=device)  # (text token t at P + t)
        seg = torch.cat([torch.zeros(P, dtype=torch.bool, device=device), is_text])
        reach = torch.cat([torch.full((P,), prompt_end - 1, device=device), t.clamp(min=prompt_end - 1)])
        pad = torch.cat([zeros[:1].expand(P) if n else zeros.new_zeros(P), zeros])  # (virtual rows: the prompt's)
        key_t = torch.cat([torch.full((P,), -1, device=device), t])  # (virtual keys: always seen)
        seen = (key_t[None, :] <= reach[:, None]) & ((key_t[None, :] < 0) | (key_t[None, :] >= pad[:, None]))
        live = torch.cat([torch.ones(P, dtype=torch.bool, device=device), t >= zeros])
        bias = self._bias(q_pos[:, None], seg[:, None], q_pos[None, :], seg[None, :])
        return self._attend(q, k, v, bias, seen & live[:, None])

    def _decode_attention(self, batch, li, q, kc, vc, state, row_slots, zeros, dec, out) -> torch.Tensor:
        """The decode rows past their first forward (`dec`: which, None for all), each against its virtual tokens
        and its cached text, in one batched pass with no host sync."""
        c, P = self.config, self.config.prompt_length
        d = batch.num_decode
        tables, seqlens, slots, pos = batch.decode_tables, batch.decode_seqlens, row_slots[:d], batch.positions[:d]
        qd, is_text, z = q[:d], batch.input_ids[:d] != 0, zeros[:d]
        if dec is not None:
            tables, seqlens, slots, pos, qd, is_text, z = (t[dec] for t in (tables, seqlens, slots, pos, qd, is_text,
                                                                             z))
        bs = kc.shape[1]
        width = tables.shape[1] * bs
        keys = torch.cat([state["keys"][slots, li].to(q.dtype), kc[tables].flatten(1, 2)], 1)  # [B, P + width, H, D]
        values = torch.cat([state["values"][slots, li].to(q.dtype), vc[tables].flatten(1, 2)], 1)
        t = torch.arange(width, device=q.device)
        text_zero = state["zeros"][slots][:, : min(width, c.max_position_embeddings)] > 0
        if width > text_zero.shape[1]:  # (table columns past the longest sequence: never seen)
            text_zero = F.pad(text_zero, (0, width - text_zero.shape[1]))
        k_text = torch.cat([torch.zeros(len(slots), P, dtype=torch.bool, device=q.device), ~text_zero], 1)
        k_pos = torch.cat([torch.arange(P, device=q.device), P + t])
        seen = torch.cat([torch.ones(len(slots), P, dtype=torch.bool, device=q.device),
                          (t[None, :] < seqlens[:, None]) & (t[None, :] >= z[:, None])], 1)
        seen = seen & (pos >= z)[:, None]  # (a query masked as padding sees nothing)
        bias = self._bias((P + pos)[:, None], is_text[:, None], k_pos[None, :], k_text)
        ctx = self._attend(qd[:, None], keys, values, bias[:, None], seen[:, None])[:, 0]
        if dec is None:
            return ctx
        out = out.clone()
        out[dec] = ctx
        return out


MODEL = CpmAnt
