"""LongCat-Flash (`longcat_flash`: meituan-longcat/LongCat-Flash-Chat): DeepSeek-V3's latent attention and
softmax experts with zero-computation experts, in a layer of two attention sublayers, two dense MLPs and one
shortcut MoE.

Each of the config's `num_layers` layers i holds sublayers s = 2i and 2i + 1, each a pre-norm block of latent
attention (mla.py: queries through a latent of `q_lora_rank`, keys and values from one of `kv_lora_rank` plus
a shared rotary key, the rotary interleaved, scores times qk_head_dim ** -0.5 (times YaRN's mscale ** 2 with
`mscale_all_dim`) and a dense SwiGLU MLP of `ffn_hidden_size`; both latent norms' outputs are scaled,
c_q's by sqrt(hidden / q_lora_rank), c_kv's by sqrt(hidden / kv_lora_rank), folded into their weights). Each
sublayer has a KV cache layer of its own (2 x num_layers in all). With x the residual stream:

    x = x + Attn_2i(RMSNorm(x));       n = RMSNorm(x)      (input_layernorm.0, post_attention_layernorm.0)
    s = MoE_i(n);                      x = x + MLP_2i(n)   (the shortcut MoE reads the first MLP's input)
    x = x + Attn_2i+1(RMSNorm(x));     n = RMSNorm(x)      (input_layernorm.1, post_attention_layernorm.1)
    x = (x + MLP_2i+1(n)) + s

MoE_i: the router's logits from fp32 rows and weights over the `n_routed_experts` experts that compute and
`zero_expert_num` identity experts after them; softmax probabilities; the `moe_topk` of the largest
probability + `e_score_correction_bias` chosen, weighted by their probabilities (not renormalised) times
`routed_scaling_factor`; an identity expert adds its weight times n (moe.py's identity_experts), the others are
SwiGLU experts of `expert_ffn_hidden_size`. The rotary's frequencies are over `head_dim` dims in transformers,
which must be qk_rope_head_dim (refused otherwise); theta defaults to 1e7.

The checkpoint's sublayer tensors (`layers.{i}.self_attn.{j}.*`, `mlps.{j}.*`, `input_layernorm.{j}`,
`post_attention_layernorm.{j}`) are renamed to the shared decoder's `layers.{2i + j}.*` (`adapt`), the MoE's
(`layers.{i}.mlp.router.classifier`, `.router.e_score_correction_bias`, `.experts.*` one by one or stacked) to
`shortcut.{i}.mlp.*`; the multi-token-prediction layer (`mtp.*`) is not read. Decode rows are one batched
pass per layer: the shared decoder's ops and kernels.moe_mlp (identity experts' rows written beside the grouped
GEMMs), no host sync.

Refused by name: `zero_expert_type` other than identity, `router_bias` (transformers' router builds a bias it
never adds), `mla_scale_q_lora` / `mla_scale_kv_lora` false (transformers always scales), no query latent
(`q_lora_rank` null), a `head_dim` unlike qk_rope_head_dim, a hidden_act other than silu, tensor parallelism and
FP8 linears (latent attention: decoder.py)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.mla import mla_options
from tritonformer.backend.models.moe import MoeNames, MoeSpec, load_moe_layer
from tritonformer.backend.models.moe import tensor_shapes as moe_tensor_shapes
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

# transformers' LongcatFlashConfig defaults, where a config.json leaves them out
DEFAULTS = {"num_layers": 28, "ffn_hidden_size": 12288, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "head_dim": 64, "v_head_dim": 128, "moe_topk": 12,
            "n_routed_experts": 512, "zero_expert_num": 256, "expert_ffn_hidden_size": 2048,
            "routed_scaling_factor": 6.0, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
# transformers' canonical names -> LongCat's own (LongcatFlashConfig.attribute_map)
CANONICAL = (("intermediate_size", "ffn_hidden_size"), ("num_experts_per_tok", "moe_topk"),
             ("moe_intermediate_size", "expert_ffn_hidden_size"), ("num_local_experts", "n_routed_experts"))
SHORTCUT = "shortcut."  # the shortcut MoE's tensors: shortcut.{i}.mlp.*
_SUBLAYER = re.compile(r"^layers\.(\d+)\.(self_attn|mlps|input_layernorm|post_attention_layernorm)\.([01])\.(.+)$")
_MOE = re.compile(r"^layers\.(\d+)\.mlp\.(router|experts)\.(.+)$")


def adapt(config: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors under the names the decoder reads (the module's docstring); names already so
    (a random-weight model's, client/model_shapes.py) stay."""
    renamed = {}
    for name, t in state.items():
        if m := _SUBLAYER.match(name):
            kind = "mlp" if m[2] == "mlps" else m[2]
            name = f"layers.{2 * int(m[1]) + int(m[3])}.{kind}.{m[4]}"
        elif m := _MOE.match(name):
            rest = m[3].removeprefix("classifier.") if m[2] == "router" else m[3]
            name = f"{SHORTCUT}{m[1]}.mlp.{m[2]}.{rest}"
        renamed[name] = t
    return config, renamed


@dataclass(frozen=True)
class LongcatFlashSpec(DecoderSpec):
    """DecoderSpec of the 2 x num_layers sublayers plus the shortcut MoE of each layer."""

    shortcut: MoeSpec | None = None

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'longcat_flash' (its shortcut MoE's "
                         "identity experts would be added on every rank; supported: one GPU)")

    def extra_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shortcut MoEs' tensors (client/model_shapes.tensor_shapes), the experts stacked."""
        shapes = {}
        for i in range(self.num_layers // 2):
            shapes.update(moe_tensor_shapes(self.shortcut, f"{SHORTCUT}{i}.", self.hidden_size))
        return shapes


def _refuse(value, supported, key: str) -> None:
    if value != supported:
        raise ValueError(f"LongCat-Flash with {key} {value!r} is not supported (supported: {key} {supported!r})")


def from_hf(cfg: dict) -> LongcatFlashSpec:
    # (a config under transformers' canonical names for its own: LongcatFlashConfig's attribute_map)
    own = {canonical: name for canonical, name in CANONICAL if canonical in cfg and name not in cfg}
    cfg = {**DEFAULTS, **cfg, **{name: cfg[canonical] for canonical, name in own.items()}}
    if cfg.get("q_lora_rank") is None:
        raise ValueError("LongCat-Flash without a query latent (q_lora_rank null) is not supported "
                         "(supported: q_lora_rank set)")
    _refuse(cfg.get("zero_expert_type", "identity"), "identity", "zero_expert_type")
    _refuse(bool(cfg.get("router_bias", False)), False, "router_bias")
    _refuse(bool(cfg.get("mla_scale_q_lora", True)), True, "mla_scale_q_lora")
    _refuse(bool(cfg.get("mla_scale_kv_lora", True)), True, "mla_scale_kv_lora")
    _refuse(cfg["hidden_act"], "silu", "hidden_act")
    if cfg["head_dim"] != cfg["qk_rope_head_dim"]:
        raise ValueError(f"LongCat-Flash with head_dim {cfg['head_dim']} unlike qk_rope_head_dim "
                         f"{cfg['qk_rope_head_dim']} is not supported (transformers' rotary is head_dim wide; "
                         f"supported: head_dim equal to qk_rope_head_dim)")
    # (num_hidden_layers, where given, counts the sublayers and wins over num_layers: transformers' setter)
    layers = cfg["num_hidden_layers"] // 2 if cfg.get("num_hidden_layers") is not None else cfg["num_layers"]
    hidden = cfg["hidden_size"]
    cfg = {**cfg, "num_hidden_layers": 2 * layers, "intermediate_size": cfg["ffn_hidden_size"],
           "rope_interleave": True}
    options = mla_options(cfg)
    options["mla"] = replace(options["mla"], q_scale=math.sqrt(hidden / cfg["q_lora_rank"]),
                             kv_scale=math.sqrt(hidden / cfg["kv_lora_rank"]))
    spec = spec_from_hf(cfg, default_theta=1e7, **options)
    shortcut = MoeSpec(num_experts=cfg["n_routed_experts"], top_k=cfg["moe_topk"],
                       intermediate_size=cfg["expert_ffn_hidden_size"], normalize=False, round_weights=False,
                       layers=(True,) * layers, score_bias=True, scale=cfg["routed_scaling_factor"], router_fp32=True,
                       identity_experts=cfg["zero_expert_num"] or 0, names=MoeNames(routers=("router",)))
    return LongcatFlashSpec(**{f.name: getattr(spec, f.name) for f in fields(DecoderSpec)}, shortcut=shortcut)


class LongcatFlashDecoder(TransformerDecoder):
    """The shared decoder's sublayers (latent attention, dense MLPs) in LongCat-Flash's layer, with its shortcut
    MoEs."""

    def __init__(self, config: LongcatFlashSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        super().__init__(config, state, device, dtype)
        sizes = (f"hidden {config.hidden_size}, {config.shortcut.num_experts} experts of "
                 f"{config.shortcut.intermediate_size} and {config.shortcut.identity_experts} identity experts")

        def read(name: str, shape: tuple[int, ...], index: tuple | None = None) -> torch.Tensor:
            key = self.checked(state, name, shape, sizes)
            return self.weight(key) if index is None else state[key][index].to(device=device, dtype=dtype).contiguous()

        self.shortcuts = [load_moe_layer(config.shortcut, state, read, f"{SHORTCUT}{i}.", config.hidden_size)
                          for i in range(config.num_layers // 2)]

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The final norm's rows `[S, hidden]` for the rows in `batch.logits_index` (the module's docstring: each
        norm fused with the residual add before it; the shortcut's output joins the stream in the next norm)."""
        eps = self.config.norm_eps
        cos_sin = self.rope_cos_sin[batch.positions]
        n, stream = kernels.embedding_rms_norm(batch.input_ids, self.embed, self.layers[0].attn_norm, eps)
        for i, moe in enumerate(self.shortcuts):
            first, second = self.layers[2 * i], self.layers[2 * i + 1]
            h = self._attend(n, 2 * i, first, batch, cache, cos_sin, None)
            n, stream = kernels.rms_norm(h, first.mlp_norm, eps, stream)
            shortcut = moe(n, self.activation)
            n, stream = kernels.rms_norm(self._mlp(n, first), second.attn_norm, eps, stream)
            h = self._attend(n, 2 * i + 1, second, batch, cache, cos_sin, None)
            n, stream = kernels.rms_norm(h, second.mlp_norm, eps, stream)
            stream = stream + self._mlp(n, second)  # (then + the shortcut's: transformers' order of the sums)
            if i + 1 < len(self.shortcuts):
                n, stream = kernels.rms_norm(shortcut, self.layers[2 * i + 2].attn_norm, eps, stream)
        if not batch.logits_every_row:
            shortcut, stream = shortcut[batch.logits_index], stream[batch.logits_index]
        return kernels.rms_norm(shortcut, self.final_norm, eps, stream)[0]


MODEL = LongcatFlashDecoder
