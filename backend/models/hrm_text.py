"""HRM-Text (`hrm_text`: sapientinc/HRM-Text-1B): two stacks of Llama-style layers, L (fast) and H (slow), run
recurrently over the same tokens with the other stack's state injected into each one's input:

    z_H = embed(ids) * embedding_scale,  z_L = z_L_init (a learnt [hidden] row, every token's)
    H_cycles times:  L_cycles times  z_L = L(z_L + z_H);  then  z_H = H(z_H + z_L)
    logits = lm_head(z_H)

A stack is `num_layers_per_stack` pre-norm layers (RMSNorms without a weight before attention and the MLP), closed
by an RMSNorm without a weight of its own (`final_norm`); no norm after the last stack but that one. Attention is
multi-head (as many KV heads as query heads, whatever `num_key_value_heads` says: transformers' k / v projections are
`num_attention_heads` wide), Llama's rotary, its output gated per element by sigmoid(gate_proj(x)) before o_proj (the
shared decoder's attn_output_gate); the MLP is gated (SwiGLU as published; GeGLU where `hidden_act` says gelu).

Served as a decoder of H_cycles x (L_cycles + 1) x num_layers_per_stack virtual layers in the order they run, each
with a KV-cache layer of its own (transformers' cache slot (h * (L_cycles + 1) + l) * num_layers_per_stack + layer,
the same order), whose weights are one of the 2 x num_layers_per_stack real layers' (DecoderSpec.layer_sources: read
once, shared); the forward below runs the recurrence over them, each stack's residual chain the shared decoder's
(the injection add folded into the stack's first norm). The weightless norms read weights of ones.

`prefix_lm` (transformers' default and the published value, true): instruction tokens attend bidirectionally only
where a caller passes `token_type_ids`; for a plain token prompt transformers builds no prefix block and every token
attends causally, which is what is served (a request has no instruction / response boundary to pass). Both values
load. `L_bp_cycles` routes gradients in training only.

The fused tensors of legacy checkpoints, which transformers' conversion mapping for hrm_text splits, are read as well:
`attn.gqkv_proj` (gate, q, k, v rows), `mlp.gate_up_proj` (gate, up rows), `attn.o_proj`. Refused by name: `attention_bias` (a bias
on the output gate's projection too), a `hidden_act` other than silu / gelu / gelu_pytorch_tanh, tensor parallelism
and FP8 linears (the recurrence runs a forward of its own, one GPU, 16-bit weights)."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

MODEL_TYPE = "hrm_text"
# transformers' HrmTextConfig defaults, where a config.json leaves a key out
DEFAULTS = {"vocab_size": 151808, "hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 16,
            "num_attention_heads": 12, "hidden_act": "silu", "max_position_embeddings": 2048,
            "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "head_dim": 128,
            "H_cycles": 2, "L_cycles": 3}
# hidden_act -> the gated MLP's activation (DecoderSpec.activation)
ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
STACKS = ("L_module", "H_module")  # (real layers 0 .. n - 1 are L's, n .. 2n - 1 H's)


@dataclass(frozen=True)
class HrmSpec(DecoderSpec):
    h_cycles: int = 2
    l_cycles: int = 3
    stack_layers: int = 1  # num_layers_per_stack: each stack's real layers
    fp8_refused: bool = True  # (decoder.load_decoder refuses FP8 linears by model_type)

    def check_split(self, tp) -> None:
        raise ValueError(f"tensor parallelism is not supported for model_type {MODEL_TYPE!r} (supported: one GPU; "
                         f"the recurrence over the two stacks runs a forward of its own)")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint holds, by transformers' names (the model prefix stripped)."""
        hidden, inter, rows = self.hidden_size, self.intermediate_size, self.num_heads * self.head_dim
        shapes = {"embed_tokens.weight": (self.vocab_size, hidden), "z_L_init": (hidden,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, hidden)
        for stack in STACKS:
            for j in range(self.stack_layers):
                p = f"{stack}.layers.{j}."
                shapes.update({p + f"self_attn.{name}_proj.weight": (rows, hidden) for name in "qkv"})
                shapes.update({p + "self_attn.gate_proj.weight": (rows, hidden), p + "self_attn.o_proj.weight":
                               (hidden, rows), p + "mlp.gate_proj.weight": (inter, hidden),
                               p + "mlp.up_proj.weight": (inter, hidden), p + "mlp.down_proj.weight": (hidden, inter)})
                if self.mlp_bias:
                    shapes.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                                   p + "mlp.down_proj.bias": (hidden,)})
        return shapes


def stack_layers(cfg: dict) -> int:
    """Each stack's real layer count: `num_layers_per_stack` (a config transformers wrote, `num_hidden_layers` then the
    virtual count), else `num_hidden_layers` (a first construction's, or a legacy config's)."""
    return cfg.get("num_layers_per_stack") or cfg.get("num_hidden_layers", DEFAULTS["num_hidden_layers"])


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors as the shared decoder reads them: stack L's layer j as `layers.{j}.`, H's as
    `layers.{n + j}.`; the fused projections of legacy checkpoints split into transformers' rows (views, or only
    those rows read from a lazy tensor); the weightless norms' weights as ones."""
    n = stack_layers(cfg)
    stacks = re.compile(r"^(L_module|H_module)\.layers\.(\d+)\.")
    renamed = {}
    for name, t in state.items():
        m = stacks.match(name)
        if m is None:
            renamed[name] = t
            continue
        p = f"layers.{int(m.group(2)) + (n if m.group(1) == 'H_module' else 0)}."
        rest = name[m.end():]
        if rest == "attn.gqkv_proj.weight":  # (gate, q, k, v: four equal row blocks)
            size = t.shape[0] // 4
            for k, part in enumerate(("gate", "q", "k", "v")):
                renamed[p + f"self_attn.{part}_proj.weight"] = t[k * size:(k + 1) * size]
        elif rest == "mlp.gate_up_proj.weight":  # (gate, up: two)
            size = t.shape[0] // 2
            renamed[p + "mlp.gate_proj.weight"], renamed[p + "mlp.up_proj.weight"] = t[:size], t[size:]
        else:  # (and the published `attn.o_proj` as transformers names it)
            renamed[p + ("self_" + rest if rest.startswith("attn.o_proj.") else rest)] = t
    if state:
        hidden = cfg.get("hidden_size", DEFAULTS["hidden_size"])
        ones = torch.ones(hidden)
        renamed["norm.weight"] = ones
        for i in range(2 * n):
            for norm in ("input_layernorm", "post_attention_layernorm"):
                renamed[f"layers.{i}.{norm}.weight"] = ones
    return cfg, renamed


def from_hf(cfg: dict) -> HrmSpec:
    cfg = {**DEFAULTS, **cfg}
    act = cfg["hidden_act"]
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported {MODEL_TYPE} hidden_act {act!r} (supported: hidden_act "
                         f"{', '.join(ACTIVATIONS)})")
    if cfg.get("attention_bias"):
        raise ValueError(f"{MODEL_TYPE} with attention_bias is not supported (supported: attention_bias false, as "
                         f"published)")
    n, h_cycles, l_cycles = stack_layers(cfg), cfg["H_cycles"], cfg["L_cycles"]
    if n < 1 or h_cycles < 1 or l_cycles < 1:
        raise ValueError(f"{MODEL_TYPE} needs a layer per stack and a cycle of each (num_layers_per_stack {n}, "
                         f"H_cycles {h_cycles}, L_cycles {l_cycles})")
    # Each invocation's layers in the order they run: L's (real 0 .. n - 1) L_cycles times, then H's (n .. 2n - 1).
    sources = tuple(j + (n if step == l_cycles else 0) for _ in range(h_cycles) for step in range(l_cycles + 1)
                    for j in range(n))
    scale = cfg.get("embedding_scale")
    heads = cfg["num_attention_heads"]
    base = spec_from_hf({**cfg, "num_hidden_layers": len(sources), "num_key_value_heads": heads},
                        activation=ACTIVATIONS[act], attn_output_gate=True,
                        embed_scale=float(scale) if scale is not None else 1.0 / cfg["initializer_range"],
                        layer_sources=sources)
    return HrmSpec(**{f.name: getattr(base, f.name) for f in fields(base)}, h_cycles=h_cycles, l_cycles=l_cycles,
                   stack_layers=n)


class HrmTextDecoder(TransformerDecoder):
    def __init__(self, config: HrmSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        init = state.get("z_L_init")  # (transformers initialises it to zeros and never trains it)
        self.z_l_init = (self.weight("z_L_init") if init is not None
                         else torch.zeros(config.hidden_size, device=device, dtype=dtype))

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The recurrence (see the module's docstring) over the packed tokens: z_H's rows in `batch.logits_index`,
        closed by H's final norm (which runs on those rows only)."""
        c = self.config
        cos_sin = self.rope_cos_sin[batch.positions]
        z_h = self._embed(batch.input_ids)
        z_l = self.z_l_init.expand_as(z_h).contiguous()
        n, first = c.stack_layers, 0
        for cycle in range(c.h_cycles):
            for step in range(c.l_cycles + 1):
                layers = self.layers[first:first + n]
                first += n
                if step < c.l_cycles:
                    z_l = self._stack(z_l, z_h, layers, batch, cache, cos_sin)
                else:
                    last = cycle + 1 == c.h_cycles
                    z_h = self._stack(z_h, z_l, layers, batch, cache, cos_sin, last=last)
        return z_h

    def _stack(self, x: torch.Tensor, injected: torch.Tensor, layers: list, batch: DecoderBatch, cache: PagedKVCache,
               cos_sin: torch.Tensor, last: bool = False) -> torch.Tensor:
        """One stack's run over its input x + injected (that sum the first residual stream, written by the first
        layer's norm): the shared decoder's pre-norm chain, then the stack's final norm (on the logits' rows only
        where `last`)."""
        eps = self.config.norm_eps
        pre = kernels.PreNorm(layers[0].attn_norm, None, eps, residual=injected, sum_out=torch.empty_like(x))
        residual = pre.sum_out
        for j, layer in enumerate(layers):
            h = self._attend(x, layer.kv_index, layer, batch, cache, cos_sin, None, pre)
            mlp_pre = kernels.PreNorm(layer.mlp_norm, None, eps, residual=residual, sum_out=torch.empty_like(residual))
            residual = mlp_pre.sum_out
            up = kernels.linear_act(h, layer.gate_up_w, layer.gate_up_b, self.activation, prenorm=mlp_pre)
            x = kernels.linear_act(up, layer.down_w, layer.down_b)
            if j + 1 < len(layers):
                pre = kernels.PreNorm(layers[j + 1].attn_norm, None, eps, residual=residual,
                                      sum_out=torch.empty_like(residual))
                residual = pre.sum_out
        if last and not batch.logits_every_row:
            x, residual = x[batch.logits_index], residual[batch.logits_index]
        return kernels.rms_norm(x, self.final_norm, eps, residual)[0]


MODEL = HrmTextDecoder
