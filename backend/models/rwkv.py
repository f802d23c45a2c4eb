"""RWKV-4 (`rwkv`: RWKV/rwkv-4-169m-pile .. rwkv-4-14b-pile, the rwkv-raven-* chat checkpoints): an attention-free
recurrent decoder. The embeddings pass a LayerNorm (`blocks.0.pre_ln`), then every layer is

    x = x + time_mix(LN1(x)),   x = x + channel_mix(LN2(x))

and a final LayerNorm (`ln_out`, at eps 1e-5 whatever `layer_norm_epsilon` says: transformers builds it with
LayerNorm's default) before the head (`head`, tied to the embeddings only where `tie_word_embeddings` says so).

Both mixers mix each row with the one before it in its sequence (the token shift): for a mixing vector mu,
mix(x) = x * mu + prev * (1 - mu), prev the row before (the last row of the sequence's previous forward, zeros at
its first token). The time mix (`attention.*`) projects k = key(mix_k(x)), v = value(mix_v(x)) and
r = sigmoid(receptance(mix_r(x))) and returns output(r * wkv), where per channel, with u = time_first and
w = -exp(time_decay):

    wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (the same sums without v)

kept as transformers keeps it: a numerator, a denominator and the largest exponent seen (num, den, max; the sums
are num e^max), each step

    m = max(max, u + k);  wkv = (e^{max-m} num + e^{u+k-m} v) / (e^{max-m} den + e^{u+k-m})
    m' = max(max + w, k); num = e^{max+w-m'} num + e^{k-m'} v; den = e^{max+w-m'} den + e^{k-m'}; max = m'

in fp32 (time_decay and time_first read in fp32, as transformers keeps them: `_keep_in_fp32_modules`; wkv rounded
to the model's dtype). The channel mix (`feed_forward.*`) returns sigmoid(receptance(mix_r(x))) *
value(relu(key(mix_k(x)))^2).

`rescale_every` N > 0, as transformers runs in eval mode: layer i's two output projections (`attention.output`,
`feed_forward.value`) are divided by 2^(i // N) at load, and the residual stream is halved after every N-th layer
(exact powers of two: the same numbers as transformers' in any dtype).

The model has no attention: the paged KV cache holds no layer (its blocks only count tokens for the scheduler).
Each sequence's memory is its recurrent state (decoder/state_cache.py, a slot per sequence, fp32), per layer the
five vectors transformers keeps: both mixers' last input row (`att_shift`, `ffn_shift`, hidden wide) and num, den
and max (`attention_hidden_size` wide). A slot is zeroed before its sequence's first token (and again for a
preempted one's recompute); transformers starts max at -1e30, which a zeroed slot reads as (den is 0 there, and
at least 1 once a token is seen: one of its two terms is e^0). The recurrence is `kernels.wkv4`: one launch for
the decode rows (no host sync: a decode graph captures it) and one for the prompt chunks, each program walking
one sequence's tokens from its slot's state for a block of channels (the reference: PyTorch ops, one token at a
time). The linears and LayerNorms run on the kernels too. The longest sequence is
`context_length` (transformers' `max_position_embeddings`), though the recurrence itself has no limit.

Refused by name: `attention_hidden_size` other than `hidden_size` (transformers' state is hidden_size wide, so its
generate cannot run one); tensor parallelism and FP8 (decoder.py: the spec is not the shared decoder's)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.decoder.state_cache import StateCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids
from tritonformer.backend.models.mixers import token_shift

FINAL_NORM_EPS = 1e-5  # (ln_out: nn.LayerNorm's default, not layer_norm_epsilon)


@dataclass(frozen=True)
class RwkvSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    norm_eps: float
    rescale_every: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None

    norm_offset = 0.0  # (LayerNorm weights as they are: model_shapes.random_decoder)
    num_heads = 1  # (placeholders: the paged cache holds no layer)
    num_kv_heads = 1
    head_dim = 2

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds (`rwkv.` stripped), as the model reads them (model_shapes.random_decoder)."""
        h, inner = self.hidden_size, self.intermediate_size
        shapes = {"embeddings.weight": (self.vocab_size, h), "blocks.0.pre_ln.weight": (h,),
                  "blocks.0.pre_ln.bias": (h,), "ln_out.weight": (h,), "ln_out.bias": (h,)}
        if not self.tie_word_embeddings:
            shapes["head.weight"] = (self.vocab_size, h)
        for i in range(self.num_layers):
            p = f"blocks.{i}."
            for norm in ("ln1", "ln2"):
                shapes.update({p + norm + ".weight": (h,), p + norm + ".bias": (h,)})
            a, f = p + "attention.", p + "feed_forward."
            shapes.update({a + "time_decay": (h,), a + "time_first": (h,),
                           **{a + f"time_mix_{m}": (1, 1, h) for m in ("key", "value", "receptance")},
                           **{a + f"{m}.weight": (h, h) for m in ("key", "value", "receptance", "output")},
                           f + "time_mix_key": (1, 1, h), f + "time_mix_receptance": (1, 1, h),
                           f + "key.weight": (inner, h), f + "receptance.weight": (h, h),
                           f + "value.weight": (h, inner)})
        return shapes


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The published tensors under `rwkv.` (transformers' names) as the model reads them."""
    return cfg, {k.removeprefix("rwkv."): v for k, v in state.items()}


def from_hf(cfg: dict) -> RwkvSpec:
    hidden = cfg.get("hidden_size", 4096)
    attention = cfg.get("attention_hidden_size") or hidden
    if attention != hidden:
        raise ValueError(f"RWKV attention_hidden_size {attention} other than hidden_size {hidden} is not supported "
                         f"(transformers keeps a hidden_size-wide state; supported: attention_hidden_size unset or "
                         f"hidden_size)")
    return RwkvSpec(
        vocab_size=cfg.get("vocab_size", 50277), hidden_size=hidden,
        intermediate_size=cfg.get("intermediate_size") or 4 * hidden,
        num_layers=cfg.get("num_hidden_layers", 32), norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        rescale_every=cfg.get("rescale_every", 6),
        max_position_embeddings=cfg.get("context_length") or cfg.get("max_position_embeddings") or 1024,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), eos_token_ids=eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"))


class TimeMix:
    """RWKV-4's time mix of one layer (module docstring), its state five named vectors at each sequence's slot."""

    def __init__(self, prefix: str, hidden: int, weight, read):
        self.mix = {m: weight(prefix + f"time_mix_{m}", 1, 1, hidden).view(hidden)
                    for m in ("key", "value", "receptance")}
        self.keep = {m: 1 - mu for m, mu in self.mix.items()}  # (1 - mu in the model's dtype, as transformers has it)
        self.key_w = weight(prefix + "key.weight", hidden, hidden)
        self.value_w = weight(prefix + "value.weight", hidden, hidden)
        self.receptance_w = weight(prefix + "receptance.weight", hidden, hidden)
        self.output_w = weight(prefix + "output.weight", hidden, hidden)
        self.u = read(prefix + "time_first", (hidden,)).float()
        self.w = -torch.exp(read(prefix + "time_decay", (hidden,)).float())
        self.state_shapes = {"att_shift": (hidden,), "num": (hidden,), "den": (hidden,), "max": (hidden,)}

    def __call__(self, x: torch.Tensor, batch: DecoderBatch, state: dict[str, torch.Tensor],
                 prompt_lens: torch.Tensor | None) -> torch.Tensor:
        """`prompt_lens`: batch.prefill_lens on the device (made once a forward, shared by the layers)."""
        prev = token_shift(x, batch, state["att_shift"])
        k, v, r = (x * self.mix[m] + prev * self.keep[m] for m in ("key", "value", "receptance"))
        k = kernels.linear_act(k, self.key_w).float()
        v = kernels.linear_act(v, self.value_w)
        r = torch.sigmoid(kernels.linear_act(r, self.receptance_w))
        return kernels.linear_act(r * self._wkv(k, v, batch, state, prompt_lens).to(x.dtype), self.output_w)

    def _wkv(self, k: torch.Tensor, v: torch.Tensor, batch: DecoderBatch, state: dict[str, torch.Tensor],
             prompt_lens: torch.Tensor | None):
        """wkv of every row `[T, hidden]` fp32 (kernels.wkv4), each sequence's num / den / max read at its slot and
        written back: the decoding rows' one step together, then each prompt chunk's steps in turn."""
        num, den, top = state["num"], state["den"], state["max"]
        slots, d = batch.state_slots, batch.num_decode
        parts = []
        if d:
            parts.append(kernels.wkv4(k[:d], v[:d], self.u, self.w, num, den, top, slots[:d]))
        if prompt_lens is not None:
            parts.append(kernels.wkv4(k[d:], v[d:], self.u, self.w, num, den, top, slots[d : d + len(prompt_lens)],
                                      prompt_lens))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class ChannelMix:
    """RWKV-4's channel mix of one layer (module docstring), its state the last input row at each sequence's slot."""

    def __init__(self, prefix: str, hidden: int, inner: int, weight):
        self.mix_k = weight(prefix + "time_mix_key", 1, 1, hidden).view(hidden)
        self.mix_r = weight(prefix + "time_mix_receptance", 1, 1, hidden).view(hidden)
        self.keep_k, self.keep_r = 1 - self.mix_k, 1 - self.mix_r
        self.key_w = weight(prefix + "key.weight", inner, hidden)
        self.receptance_w = weight(prefix + "receptance.weight", hidden, hidden)
        self.value_w = weight(prefix + "value.weight", hidden, inner)
        self.state_shapes = {"ffn_shift": (hidden,)}

    def __call__(self, x: torch.Tensor, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        prev = token_shift(x, batch, state["ffn_shift"])
        k = kernels.linear_act(x * self.mix_k + prev * self.keep_k, self.key_w, activation="relu2")
        r = torch.sigmoid(kernels.linear_act(x * self.mix_r + prev * self.keep_r, self.receptance_w))
        return r * kernels.linear_act(k, self.value_w)


@dataclass
class RwkvLayer:
    """One layer: its two LayerNorms (weight, bias) and mixes (each with its `state_shapes`, as mixers.py's)."""
    ln1: tuple[torch.Tensor, torch.Tensor]
    att: TimeMix
    ln2: tuple[torch.Tensor, torch.Tensor]
    ffn: ChannelMix


class RwkvDecoder(DecoderModel):
    def __init__(self, config: RwkvSpec, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 tp=None):
        if tp is not None:
            raise ValueError("tensor parallelism is not supported for model_type 'rwkv'")
        super().__init__(config, state, device, dtype)
        c = config
        hidden, inner = c.hidden_size, c.intermediate_size

        def weight(name: str, *shape: int) -> torch.Tensor:
            return read(name, shape).to(device=device, dtype=dtype).contiguous()

        def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            """The checkpoint's tensor as stored (time_decay and time_first stay fp32), its shape checked."""
            if name not in state:
                raise KeyError(f"checkpoint is missing weight {name!r}")
            if tuple(state[name].shape) != tuple(shape):
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(state[name].shape)}, but the config "
                                 f"(hidden_size {hidden}, intermediate_size {inner}, vocab_size {c.vocab_size}) "
                                 f"says {tuple(shape)}")
            return state[name].to(device=device)

        def norm(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return weight(name + ".weight", hidden), weight(name + ".bias", hidden)

        self.num_kv_layers = 0
        self.embed = weight("embeddings.weight", c.vocab_size, hidden)
        self.set_output_head(self.embed if c.tie_word_embeddings else weight("head.weight", c.vocab_size, hidden))
        self.pre_norm = norm("blocks.0.pre_ln")
        self.final_norm = norm("ln_out")
        self.layers = []
        for i in range(c.num_layers):
            p = f"blocks.{i}."
            att = TimeMix(p + "attention.", hidden, weight, read)
            ffn = ChannelMix(p + "feed_forward.", hidden, inner, weight)
            if c.rescale_every > 0:  # (transformers' eval-mode rescaling: exact, a power of two)
                scale = 2 ** (i // c.rescale_every)
                att.output_w, ffn.value_w = att.output_w / scale, ffn.value_w / scale
            self.layers.append(RwkvLayer(norm(p + "ln1"), att, norm(p + "ln2"), ffn))
        self.state_layouts = [{**layer.att.state_shapes, **layer.ffn.state_shapes} for layer in self.layers]

    def new_state_cache(self, num_slots: int) -> StateCache:
        return StateCache(self.state_layouts, num_slots, self.device)

    def _norm(self, x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor], residual: torch.Tensor | None = None,
              eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(LayerNorm(x + residual), x + residual: the residual stream, written by the same launch)."""
        total = None if residual is None else torch.empty_like(residual)
        eps = self.config.norm_eps if eps is None else eps
        out = kernels.add_bias_residual_layer_norm(x, None, residual, norm[0], norm[1], eps, sum_out=total)
        return out, x if total is None else total

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        c = self.config
        if batch.state_slots is None:
            raise ValueError("RWKV needs its sequences' state slots (DecoderBatch.state_slots)")
        x = self._norm(self.embed[batch.input_ids], self.pre_norm)[0]  # the residual stream
        prompt_lens = None
        if batch.prefill_lens:  # (one host-to-device copy a forward, not one a layer)
            prompt_lens = torch.tensor(batch.prefill_lens, dtype=torch.int32).to(x.device, non_blocking=True)
        for i, layer in enumerate(self.layers):
            state = cache.state.layer(i)
            h = layer.att(self._norm(x, layer.ln1)[0], batch, state, prompt_lens)
            h, x = self._norm(h, layer.ln2, x)
            x = x + layer.ffn(h, batch, state)
            if c.rescale_every > 0 and (i + 1) % c.rescale_every == 0:
                x = x / 2
        if not batch.logits_every_row:
            x = x[batch.logits_index]
        return self.logits(self._norm(x, self.final_norm, eps=FINAL_NORM_EPS)[0], fp32_logits)


MODEL = RwkvDecoder
