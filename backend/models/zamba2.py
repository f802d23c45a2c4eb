"""Zamba2 (`zamba2`: Zyphra's Zamba2-1.2B / 2.7B / 7B): a stack of Mamba-2 layers (mamba2.py) into some of which
(`layers_block_type` "hybrid", transformers' `hybrid_layer_ids`) a shared transformer block feeds its output.

Every layer i is a pre-norm Mamba-2 layer over the residual stream h (its norm `input_layernorm`):

    h <- h + Mamba2(RMSNorm(h + t_i))          (t_i = 0 in a plain layer)

A hybrid layer's t_i comes from one of `num_mem_blocks` shared blocks, in turn (the j-th hybrid layer runs block
j mod num_mem_blocks): its weights are the same at each of its invocations, each invocation with its own
low-rank adapters (LoRA: x -> B_j A_j x) and its own keys and values (a KV cache layer of its own: it attends
over the keys it wrote at that depth). With e the token embeddings (the first h):

    u = RMSNorm_2H([h ; e])                                   (input_layernorm, 2 x hidden wide)
    q, k, v = W_qkv u + B_j A_j u                             (the adapters where use_shared_attention_adapter)
    a = W_o Attention(q, k, v)                                (heads of 2 x hidden / num_attention_heads, scores
                                                               scaled by (head_dim / 2) ** -0.5; a rotary over
                                                               whole heads only where use_mem_rope)
    m = RMSNorm(a)                                            (pre_ff_layernorm: no residual around either)
    g = W_gu m + B'_j A'_j m + b_gu                           ([gate; up], its adapter's rows alike)
    t_i = L_i (W_down act(gate) * up + b_down)                (L_i: the layer's own `linear`, hidden x hidden)

The attention has no biases; the MLP has them where `add_bias_linear` (so do the Mamba layers' in_proj and
out_proj). `act` is `hidden_act` (gelu: the exact GELU, Zamba2's; gelu_pytorch_tanh / gelu_new; silu). The final
norm is `final_layernorm`, the head tied to the embeddings unless `tie_word_embeddings` is false.

The shared blocks' weights are read once, from the first hybrid layer that runs each block
(`layers.{i}.shared_transformer.*`: later invocations' copies in a checkpoint are the same tensors, tied); the
adapters of invocation j from that block's lists (`linear_{q,k,v}_adapter_list.{j}`,
`gate_up_proj_adapter_list.{j}`). transformers ties those copies only where it ties the head to the embeddings: with
`tie_word_embeddings` false each hybrid layer runs a block of its own, its own copy's weights and adapters, as here
(a checkpoint holding only the first copies, as saved with the ties: those, the shared model). The Mamba layer of a
hybrid layer is `mamba_decoder.*` (renamed to the plain layers' names by `adapt`).

The adapters run as their own two small linears beside the shared projection (the shared weight is never copied
per invocation): the QKV adapters' A stacked into one [3 rank, 2H] linear, their B block-diagonal, added to the QKV
projection's rows as transformers adds each adapter's output. Decode rows are one batched pass per layer: the
linears, the attention over the paged cache and the Mamba-2 step (kernels.ssd_decode), no host sync.

Zamba2's Mamba-2 is mamba2.py's as transformers builds it: the conv always has a bias (`use_conv_bias` is not
read), the gated norm's epsilon is 1e-5 whatever rms_norm_eps says, dt is clamped from below at
`time_step_min`, the head width is mamba_expand x hidden / n_mamba_heads (`mamba_headdim` not read).

Tensor parallelism (Megatron-LM's split, as the shared decoder's): the embedding and the head by vocabulary rows;
the Mamba-2 layers by heads (mamba2.Mamba2Mixer, as Bamba's: one group of B / C whole on every rank, its gated
norm's mean square summed over the ranks; more groups split); each shared block's attention by heads (its rows of
q, k, v, each rank its KV heads' cache, its columns of W_o, one all-reduce after it) and its MLP by columns (its
rows of gate and of up, its columns of W_down, whose bias rank 0 adds). Whole on every rank: the norms, the
adapters' A (rank x width: small), their B's rows those of the projection they add to, and each hybrid layer's own
linear L_i (hidden x hidden), which maps each rank's partial sum of W_down's output as it is, so that one
all-reduce after L_i sums both (L_i is linear). Heads, KV heads, MLP columns or Mamba-2 heads that do not divide by
the ranks are refused at load, by name.

Refused by name: layer kinds other than mamba / linear_attention and hybrid, a `hybrid_layer_ids` unlike the
layers `layers_block_type` names hybrid, `use_shared_mlp_adapter` false (transformers always builds the MLP's
adapters), attention adapters with fewer KV heads than query heads (their outputs are 2 x hidden wide), a
hidden_act other than those above, and FP8 linears (hybrid models: decoder.py)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.mamba2 import KIND, HybridSpec, Mamba2Decoder, Mamba2Spec, hybrid_spec
from tritonformer.backend.models.transformer import WeightNames, spec_from_hf
from tritonformer.backend.parallel.group import adds_biases

NAMES = WeightNames(final_norm="final_layernorm.weight")
HYBRID = "hybrid"
LAYER_KINDS = {"mamba": KIND, "linear_attention": KIND, HYBRID: HYBRID}
# hidden_act -> kernels.gated_act's name for the shared MLP's act(gate) * up
ACTIVATIONS = {"gelu": "gelu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul", "gelu_new": "gelu_tanh_mul",
               "silu": "silu_mul"}
BLOCK = "shared_transformer."


@dataclass(frozen=True)
class Zamba2Spec(HybridSpec):
    """The hybrid spec (every layer a Mamba-2 one, none with an MLP of its own) with the shared blocks' options; the
    spec's heads, KV heads, head_dim, intermediate_size, rope and attn_scale are the shared blocks'."""
    hybrid_layers: tuple[int, ...] = ()  # the layers a shared block feeds, in order: invocation j is hybrid_layers[j]
    num_mem_blocks: int = 1
    adapter_rank: int = 128
    attention_adapter: bool = False  # LoRA adapters on q, k, v (use_shared_attention_adapter)
    mem_rope: bool = False  # the shared attention rotates q and k (use_mem_rope)
    block_bias: bool = False  # biases on the shared MLP's linears (add_bias_linear)
    block_activation: str = "gelu_mul"  # kernels.gated_act's name
    # The blocks' weights the same at each invocation (transformers ties them with tie_word_embeddings); False: each
    # hybrid layer's copy its own
    tied_blocks: bool = True

    @property
    def attends(self) -> bool:
        """The shared blocks attend (their heads split over the ranks, each rank its KV heads' cache)."""
        return True

    def split_mixers(self, tp) -> None:
        """The Mamba-2 layers' heads (and groups) divide by the ranks; the shared blocks' heads, KV heads and MLP
        columns are checked as attention's (decoder._check_split)."""
        tp.part(self.mamba.num_heads, "Mamba-2 heads (n_mamba_heads)")
        super().split_mixers(tp)

    def block_prefix(self, invocation: int) -> str:
        """Where invocation `invocation`'s block and adapters are read: under the first hybrid layer that runs its
        block (tied_blocks), else under its own layer."""
        first = self.hybrid_layers[invocation % self.num_mem_blocks] if self.tied_blocks else None
        return f"layers.{self.hybrid_layers[invocation] if first is None else first}.{BLOCK}"

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A layer's Mamba-2 tensors, and a hybrid layer's own linear, its adapters and (the first of a block's
        invocations) the shared block's tensors (client/model_shapes.tensor_shapes)."""
        shapes = super().mixer_tensors(layer, prefix)
        if layer not in self.hybrid_layers:
            return shapes
        h, wide, inter, r = self.hidden_size, 2 * self.hidden_size, self.intermediate_size, self.adapter_rank
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        j = self.hybrid_layers.index(layer)
        block = self.block_prefix(j)
        shapes[prefix + "linear.weight"] = (h, h)
        mlp = block + "feed_forward."
        shapes.update({f"{mlp}gate_up_proj_adapter_list.{j}.0.weight": (r, h),
                       f"{mlp}gate_up_proj_adapter_list.{j}.1.weight": (2 * inter, r)})
        if self.attention_adapter:
            for part in "qkv":
                shapes.update({f"{block}self_attn.linear_{part}_adapter_list.{j}.0.weight": (r, wide),
                               f"{block}self_attn.linear_{part}_adapter_list.{j}.1.weight": (wide, r)})
        if j < self.num_mem_blocks or not self.tied_blocks:  # (the block's own tensors, once)
            attn = block + "self_attn."
            shapes.update({attn + "q_proj.weight": (q, wide), attn + "k_proj.weight": (kv, wide),
                           attn + "v_proj.weight": (kv, wide), attn + "o_proj.weight": (h, q),
                           mlp + "gate_up_proj.weight": (2 * inter, h), mlp + "down_proj.weight": (h, inter),
                           block + "input_layernorm.weight": (wide,), block + "pre_ff_layernorm.weight": (h,)})
            if self.block_bias:
                shapes.update({mlp + "gate_up_proj.bias": (2 * inter,), mlp + "down_proj.bias": (h,)})
        return shapes


def layer_kinds(cfg: dict) -> list[str]:
    """Each layer's kind, KIND (a Mamba-2 layer) or HYBRID (one a shared block feeds), from `layers_block_type`
    (transformers' `layer_types`)."""
    layers = cfg["num_hidden_layers"]
    kinds = cfg.get("layers_block_type") or cfg.get("layer_types")
    if kinds is None:
        raise ValueError("Zamba2 without layers_block_type is not supported (supported: layers_block_type, naming "
                         "each layer mamba / linear_attention or hybrid)")
    if len(kinds) != layers or not set(kinds) <= set(LAYER_KINDS):
        raise ValueError(f"unsupported Zamba2 layers_block_type {kinds!r} (supported: layers_block_type mamba / "
                         f"linear_attention or hybrid for each of the {layers} layers)")
    return [LAYER_KINDS[k] for k in kinds]


def _mamba(cfg: dict) -> Mamba2Spec:
    inter = int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
    heads = cfg.get("n_mamba_heads", 8)
    return Mamba2Spec(num_heads=heads, head_dim=inter // heads, state_size=cfg.get("mamba_d_state", 64),
                      num_groups=cfg.get("mamba_ngroups", 1), intermediate_size=inter,
                      conv_kernel=cfg.get("mamba_d_conv", 4), chunk_size=cfg.get("chunk_size") or 256,
                      conv_bias=True, proj_bias=bool(cfg.get("add_bias_linear", False)), norm_eps=1e-5,
                      time_step_limit=(float(cfg.get("time_step_min", 0.001)), float("inf")))


def from_hf(cfg: dict) -> Zamba2Spec:
    kinds = layer_kinds(cfg)
    hybrid = tuple(i for i, kind in enumerate(kinds) if kind == HYBRID)
    listed = cfg.get("hybrid_layer_ids")
    if listed is not None and tuple(listed) != hybrid:
        raise ValueError(f"Zamba2 hybrid_layer_ids {list(listed)} are not the layers layers_block_type names hybrid "
                         f"{list(hybrid)} (supported: hybrid_layer_ids as layers_block_type lists them)")
    if cfg.get("use_shared_mlp_adapter", True) is False:
        raise ValueError("Zamba2 with use_shared_mlp_adapter false is not supported (supported: use_shared_mlp_adapter "
                         "true, which is what transformers runs whatever the config says)")
    act = cfg.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported Zamba2 hidden_act {act!r} (supported: hidden_act {', '.join(ACTIVATIONS)})")
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    if (2 * hidden) % heads:
        raise ValueError(f"Zamba2: {heads} attention heads do not divide its attention width 2 x {hidden}")
    head_dim = 2 * hidden // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    adapters = bool(cfg.get("use_shared_attention_adapter", False))
    if adapters and kv_heads != heads:
        raise ValueError(f"Zamba2 use_shared_attention_adapter with num_key_value_heads {kv_heads} is not supported "
                         f"(supported: num_key_value_heads {heads}, as many as the query heads: the adapters' "
                         f"outputs are 2 x hidden wide)")
    layers = len(kinds)
    positions = 16384 if cfg.get("use_long_context") else cfg.get("max_position_embeddings", 4096)
    spec = spec_from_hf({**cfg, "head_dim": head_dim, "num_key_value_heads": kv_heads,
                         "intermediate_size": cfg.get("intermediate_size") or 4 * hidden,
                         "max_position_embeddings": positions},
                        tie_default=True, norm_eps=cfg.get("rms_norm_eps", 1e-5), mixers=(KIND,) * layers,
                        mlp_layers=(False,) * layers, attn_scale=(head_dim / 2) ** -0.5, names=NAMES)
    base = hybrid_spec(spec, _mamba(cfg))
    return Zamba2Spec(**{f.name: getattr(base, f.name) for f in fields(base)}, hybrid_layers=hybrid,
                      num_mem_blocks=int(cfg.get("num_mem_blocks", 1)), adapter_rank=int(cfg.get("adapter_rank", 128)),
                      attention_adapter=adapters, mem_rope=bool(cfg.get("use_mem_rope", False)),
                      block_bias=bool(cfg.get("add_bias_linear", False)), block_activation=ACTIVATIONS[act],
                      tied_blocks=spec.tie_word_embeddings)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """A hybrid layer's Mamba-2 layer (`layers.{i}.mamba_decoder.*`) under a plain layer's names (`layers.{i}.*`)."""
    marker = ".mamba_decoder."
    if not any(marker in name for name in state):
        return cfg, state
    return cfg, {name.replace(marker, ".", 1) if name.startswith("layers.") else name: t for name, t in state.items()}


@dataclass
class SharedBlock:
    """One shared transformer block's weights (the same at each of its invocations)."""
    attn_norm: torch.Tensor  # [2H]
    qkv_w: torch.Tensor  # [(heads + 2 kv heads) * head_dim, 2H]
    o_w: torch.Tensor  # [H, heads * head_dim]
    mlp_norm: torch.Tensor  # [H]
    gate_up_w: torch.Tensor  # [2I, H]
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor  # [H, I]
    down_b: torch.Tensor | None


@dataclass
class Invocation:
    """A hybrid layer's own part of its shared block's run: its adapters, its KV cache layer, its output linear."""
    block: int  # (an index into Zamba2Decoder.blocks)
    kv_index: int
    qkv_a: torch.Tensor | None  # [3 rank, 2H]: the q, k, v adapters' A stacked (use_shared_attention_adapter)
    qkv_b: torch.Tensor | None  # [(heads + 2 kv heads) * head_dim, 3 rank]: their B, block-diagonal
    mlp_a: torch.Tensor | None  # [rank, H] (None: no adapters, adapter_rank 0: Zamba v1's block)
    mlp_b: torch.Tensor | None  # [2I, rank]
    out_w: torch.Tensor  # [H, H]: the layer's `linear`


class Zamba2Decoder(Mamba2Decoder):
    """The shared decoder's Mamba-2 layers (each with its input norm, none with an MLP), run by a forward of
    Zamba2's own that feeds the hybrid layers from the shared blocks (see the module's docstring)."""

    def __init__(self, config: Zamba2Spec, state, device, dtype, tp=None):
        """With `tp`, this rank's share (see the module's docstring): the Mamba-2 layers split by heads
        (mamba2.Mamba2Mixer), the shared blocks' QKV rows of its heads, its columns of the output projection, its
        rows of gate and of up and columns of down; the adapters' A, the layers' own linear and the norms whole."""
        if tp is not None:
            config.split_mixers(tp)
        super().__init__(config, state, device, dtype, tp=tp)
        c = config  # (the whole model's sizes, as the checkpoint holds them; self.config: this rank's share's)
        h, wide, inter, r = c.hidden_size, 2 * c.hidden_size, c.intermediate_size, c.adapter_rank
        q_rows, kv_rows = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        # This rank's rows of q, of k / v and of gate / up (each of its half of gate_up): all of them without tp
        q_part, kv_part, mlp_part = slice(0, q_rows), slice(0, kv_rows), slice(0, inter)
        if tp is not None:
            heads, kv_heads = tp.part(c.num_heads, "attention heads"), tp.part(c.num_kv_heads, "KV heads")
            q_part = slice(heads.start * c.head_dim, heads.stop * c.head_dim)
            kv_part = slice(kv_heads.start * c.head_dim, kv_heads.stop * c.head_dim)
            mlp_part = tp.part(inter, "MLP columns (intermediate_size)")
        gate_up_rows = [mlp_part, slice(inter + mlp_part.start, inter + mlp_part.stop)]
        first_rank = adds_biases(tp)

        sizes = (f"hidden {h}, heads {c.num_heads}/{c.num_kv_heads} x {c.head_dim}, intermediate {inter}, "
                 f"adapter rank {r}")

        def read(name: str, *shape: int, rows: slice | list[slice] | None = None,
                 cols: slice | None = None) -> torch.Tensor:
            """The tensor (its shape checked), or its `rows` (a range, or ranges stacked) / `cols` only."""
            name = self.checked(state, name, shape, sizes)
            if tp is None or (rows is None and cols is None):  # (without tp: every row and column)
                return self.weight(name)
            if isinstance(rows, list):
                return torch.cat([read(name, *shape, rows=part, cols=cols) for part in rows])
            index = (rows or slice(None),) if cols is None else (rows or slice(None), cols)
            return state[name][index].to(device=device, dtype=dtype).contiguous()

        def block(p: str) -> SharedBlock:
            attn, mlp = p + "self_attn.", p + "feed_forward."
            return SharedBlock(
                attn_norm=read(p + "input_layernorm.weight", wide),
                qkv_w=torch.cat([read(attn + "q_proj.weight", q_rows, wide, rows=q_part),
                                 read(attn + "k_proj.weight", kv_rows, wide, rows=kv_part),
                                 read(attn + "v_proj.weight", kv_rows, wide, rows=kv_part)]),
                o_w=read(attn + "o_proj.weight", h, q_rows, cols=q_part),
                mlp_norm=read(p + "pre_ff_layernorm.weight", h),
                gate_up_w=read(mlp + "gate_up_proj.weight", 2 * inter, h, rows=gate_up_rows),
                gate_up_b=read(mlp + "gate_up_proj.bias", 2 * inter, rows=gate_up_rows) if c.block_bias else None,
                down_w=read(mlp + "down_proj.weight", h, inter, cols=mlp_part),
                # (one rank adds it: the all-reduce after the layer's linear sums the ranks' outputs)
                down_b=read(mlp + "down_proj.bias", h) if c.block_bias and first_rank else None)

        self.blocks: list[SharedBlock] = []  # (one per tensor prefix they are read from)
        sources: dict[str, int] = {}
        # Per layer its invocation of a shared block, or None (a plain Mamba-2 layer).
        self.invocations: list[Invocation | None] = [None] * c.num_layers
        parts = (q_part, kv_part, kv_part)
        for j, layer in enumerate(c.hybrid_layers):
            p = c.block_prefix(j)
            if p + "input_layernorm.weight" not in state:  # (untied blocks saved tied: the block's first copy)
                p = replace(c, tied_blocks=True).block_prefix(j)
            if p not in sources:
                sources[p] = len(self.blocks)
                self.blocks.append(block(p))
            qkv_a = qkv_b = None
            if c.attention_adapter:
                lists = [f"{p}self_attn.linear_{part}_adapter_list.{j}." for part in "qkv"]
                qkv_a = torch.cat([read(a + "0.weight", r, wide) for a in lists])
                # (B block-diagonal over this rank's rows of q, k and v: the adapters' A whole on every rank)
                own = [part.stop - part.start for part in parts]
                qkv_b = torch.zeros(sum(own), 3 * r, device=device, dtype=dtype)
                start = 0
                for k, (a, rows, part) in enumerate(zip(lists, (q_rows, kv_rows, kv_rows), parts)):
                    qkv_b[start : start + own[k], k * r : (k + 1) * r] = read(a + "1.weight", rows, r, rows=part)
                    start += own[k]
            adapter = f"{p}feed_forward.gate_up_proj_adapter_list.{j}."
            self.invocations[layer] = Invocation(
                block=sources[p], kv_index=j, qkv_a=qkv_a, qkv_b=qkv_b,
                mlp_a=read(adapter + "0.weight", r, h) if r else None,  # (adapter_rank 0: none, Zamba v1's block)
                mlp_b=read(adapter + "1.weight", 2 * inter, r, rows=gate_up_rows) if r else None,
                out_w=read(f"layers.{layer}.linear.weight", h, h))
        self.num_kv_layers = len(c.hybrid_layers)  # (each invocation's keys and values: a cache layer of its own)

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index`. A Mamba-2 layer's output joins
        the residual stream in the next layer's input norm (one PreNorm: the sum written as the new stream), but
        before a hybrid layer, whose shared block reads the stream itself."""
        c, eps = self.config, self.config.norm_eps
        embedded = self._embed(batch.input_ids)  # (the shared blocks' second input, and the first residual stream)
        cos_sin = self.rope_cos_sin[batch.positions] if c.mem_rope else None
        h, out = embedded, None  # the residual stream; the last layer's output, not yet added to it
        # (under tensor parallelism each rank's partial sums of an output: one all-reduce, fused with the norm
        # that follows it where the all-reduce kernel can)
        reduced = (lambda x, pre: (x, pre)) if self.tp is None else self.tp.all_reduce_then
        for li, layer in enumerate(self.layers):
            invocation = self.invocations[li]
            if invocation is None and out is None:
                x, pre = h, kernels.PreNorm(layer.attn_norm, None, eps)
            elif invocation is None:
                pre = kernels.PreNorm(layer.attn_norm, None, eps, residual=h, sum_out=torch.empty_like(h))
                h = pre.sum_out
                x, pre = reduced(out, pre)
            else:
                if out is not None:
                    h = h + reduced(out, None)[0]
                x = self._shared_block(h, embedded, invocation, batch, cache, cos_sin)
                # (h + t in the norm, h itself the stream: the sum is the norm's input only)
                x, pre = reduced(x, kernels.PreNorm(layer.attn_norm, None, eps, residual=h,
                                                    sum_out=torch.empty_like(h)))
            out = layer.mixer(x, pre, batch, cache.state.layer(layer.state_index))
        if not batch.logits_every_row:
            out, h = out[batch.logits_index], h[batch.logits_index]
        return kernels.rms_norm(reduced(out, None)[0], self.final_norm, eps, h)[0]

    def _shared_block(self, h: torch.Tensor, embedded: torch.Tensor, inv: Invocation, batch: DecoderBatch,
                      cache: PagedKVCache, cos_sin: torch.Tensor | None) -> torch.Tensor:
        """One invocation of a shared block over the residual stream h and the embeddings: t_i `[T, H]` (under
        tensor parallelism this rank's partial sum of it)."""
        c, eps, blk = self.config, self.config.norm_eps, self.blocks[inv.block]
        rows = h.shape[0]
        joined = torch.cat([h, embedded], dim=-1)  # [T, 2H]
        normed = torch.empty_like(joined) if inv.qkv_a is not None else None  # (the adapters read it too)
        qkv = kernels.linear_act(joined, blk.qkv_w, prenorm=kernels.PreNorm(blk.attn_norm, None, eps,
                                                                            normed_out=normed))
        if inv.qkv_a is not None:
            qkv = qkv + kernels.linear_act(kernels.linear_act(normed, inv.qkv_a), inv.qkv_b)
        cos, sin = (cos_sin[:, 0], cos_sin[:, 1]) if cos_sin is not None else (None, None)
        keys, values = cache.keys(inv.kv_index), cache.values(inv.kv_index)
        q = kernels.qkv_to_cache(qkv, None, c.num_heads, c.num_kv_heads, c.head_dim, cos, sin, keys, values,
                                 batch.slot_mapping)
        ctx = batch.attention(q, keys, values, scale=c.attn_scale)
        attended = kernels.linear_act(ctx.reshape(rows, -1), blk.o_w)
        if self.tp is not None:  # (each rank's heads' share of the output projection, summed)
            attended = self.tp.all_reduce(attended)
        normed = torch.empty_like(attended)
        gate_up = kernels.linear_act(attended, blk.gate_up_w, blk.gate_up_b,
                                     prenorm=kernels.PreNorm(blk.mlp_norm, None, eps, normed_out=normed))
        if inv.mlp_a is not None:
            gate_up = gate_up + kernels.linear_act(kernels.linear_act(normed, inv.mlp_a), inv.mlp_b)
        down = kernels.linear_act(kernels.gated_act(gate_up, c.block_activation), blk.down_w, blk.down_b)
        # (under tensor parallelism `down` is this rank's partial sum: the layer's linear maps it as it is, and the
        # caller's one all-reduce sums L_i down_r over the ranks, which is L_i of their sum)
        return kernels.linear_act(down, inv.out_w)


MODEL = Zamba2Decoder
