"""BitNet b1.58 (microsoft/bitnet-b1.58-2B-4T and its -bf16 variant): Llama's block (RMSNorms, rotary,
grouped-query attention; the head tied where `tie_word_embeddings` says, untied by default as in
transformers' BitNetConfig) with two norms inside it: `self_attn.attn_sub_norm`, an RMSNorm of the
attention's output before `o_proj`, and `mlp.ffn_sub_norm`, one of relu(gate)^2 * up before `down_proj`
(a gated MLP whose activation is the squared ReLU, `hidden_act` "relu2", the only one supported).

With a `quantization_config` (quant_method "bitnet") every linear of the layers is quantised as transformers'
integrations/bitnet.py computes it (the output head, the embeddings and the norms are not):

- linear_class "bitlinear" (offline): weights stored packed, four ternary values {-1, 0, 1} a uint8 (2 bits,
  value + 1; row block i of `rows / 4` rows in bits 2i..2i+1), and a scalar `weight_scale` per linear. The
  rows of x are quantised per token: s = 127 / max(|x|, 1e-5) (x's absmax in the activation dtype, the
  quotient in fp32), q = clamp(round(x * s), -128, 127) (round half to even, in fp32: the fused form that
  torch.compile runs), then y = (q @ W^T) / (weight_scale * s): the product of the two scales in fp32 of
  each rounded to the activation dtype, the quotient rounded once to it. (q, integers of magnitude at most 128,
  is exact in bf16 / fp16. transformers' eager form would round s and x * s to a 16-bit activation dtype as
  well; in fp32 the two agree, which is what the CPU tests check, token for token.)
- linear_class "autobitlinear", quantization_mode "offline": the same packed weights; the rows are quantised
  and dequantised before the product, in fp32: x' = clamp(round(x * s), -128, 127) / s with s = 127 /
  max(|x|, 1e-5), rounded to the activation dtype, then y = (x' @ W^T) * weight_scale (in the activation dtype).
- "autobitlinear", "online": the weights are dense; each linear's W is quantised at load as transformers does
  in every forward: W' = clamp(round(W * t), -1, 1) / t with t = 1 / max(mean|W|, 1e-5), in fp32, rounded to
  the model dtype; the rows as in "offline", without weight_scale.

The packed weights are unpacked at load into the model's dtype (the values -1, 0, 1 exact) and the weight
scales kept per output row (Q, K, V and gate, up are fused, each part its own scale). Limits: the GEMMs run on
16-bit tensor cores (kernels.linear_act) over the ternary values in bf16/fp16: there is no int8 or ternary
GEMM, so the weights take 16 bits each on the device. The activation quantisation is a few PyTorch element-wise
ops over all rows at once (one batched pass per layer, no host sync). `use_rms_norm` (a norm inside each
linear), tensor parallelism and FP8 linears are refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, spec_from_hf

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
QUANT_FORMS = (("bitlinear", "offline"), ("autobitlinear", "offline"), ("autobitlinear", "online"))


@dataclass(frozen=True)
class BitNetSpec(DecoderSpec):
    quant: str = "none"  # "none", "bitlinear", "autobitlinear" (offline) or "online" (autobitlinear online)
    fp8_refused: bool = True  # (load_decoder: FP8 linears are refused for BitNet)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a (dense: the -bf16 form's) checkpoint, by name: Llama's and the two sub norms."""
        from tritonformer.client.model_shapes import tensor_shapes

        plain = DecoderSpec(**{f.name: getattr(self, f.name) for f in fields(DecoderSpec) if f.init})
        shapes = tensor_shapes(plain)
        for i in range(self.num_layers):
            shapes[f"layers.{i}.self_attn.attn_sub_norm.weight"] = (self.hidden_size,)
            shapes[f"layers.{i}.mlp.ffn_sub_norm.weight"] = (self.intermediate_size,)
        return shapes

    def check_split(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'bitnet' (supported: one GPU)")


def from_hf(cfg: dict) -> BitNetSpec:
    act = cfg.get("hidden_act", "relu2")
    if act != "relu2":
        raise ValueError(f"unsupported BitNet hidden_act {act!r} (supported: relu2)")
    if cfg.get("attention_bias"):
        raise ValueError("BitNet with attention_bias is not supported (supported: attention_bias false)")
    quant = "none"
    q = cfg.get("quantization_config")
    if q:
        form = (q.get("linear_class", "bitlinear"), q.get("quantization_mode", "offline"))
        if q.get("quant_method") != "bitnet" or form not in QUANT_FORMS:
            raise ValueError(f"unsupported BitNet quantization_config {q!r} (supported: quant_method bitnet with "
                             f"linear_class/quantization_mode {', '.join('/'.join(f) for f in QUANT_FORMS)})")
        if q.get("use_rms_norm"):
            raise ValueError("BitNet quantization_config use_rms_norm is not supported (supported: false)")
        if q.get("modules_to_not_convert") not in (None, ["lm_head"]):
            raise ValueError(f"BitNet modules_to_not_convert {q['modules_to_not_convert']!r} is not supported "
                             "(supported: lm_head, or unset)")
        quant = "online" if form[1] == "online" else form[0]
    # (the gated relu2 is applied by this family's forward: the spec's activation field is not read)
    spec = spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-6), activation="silu", gated_mlp=True)
    return BitNetSpec(**{f.name: getattr(spec, f.name) for f in fields(spec) if f.init}, quant=quant)


def adapt(config: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's `*.weight_scale` tensors renamed `*.ternary_scale` (not FP8 scales: the FP8 path reads
    that name)."""
    renamed = {(name.removesuffix(".weight_scale") + ".ternary_scale" if name.endswith(".weight_scale") else name): t
               for name, t in state.items()}
    return config, renamed


def unpack_ternary(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[rows / 4, cols]` uint8 of four 2-bit values (value + 1) -> `[rows, cols]` in `dtype`: row block i
    (rows i * rows / 4 ..) in bits 2i..2i+1."""
    p = packed.to(torch.uint8)
    return torch.cat([((p >> (2 * i)) & 3) for i in range(4)]).to(dtype) - 1


def quantize_online(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """AutoBitLinear's online weight quantisation of `weight` (in `dtype`), in fp32, rounded to `dtype`."""
    w = weight.to(dtype).float()
    t = 1.0 / w.abs().mean().clamp(min=1e-5)
    return ((w * t).round().clamp(-1, 1) / t).to(dtype)


def bit_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, quant: str) -> torch.Tensor:
    """x `[T, K]` through a BitNet linear (module docstring): `weight` `[N, K]` the ternary (or online-quantised)
    values in x's dtype, `scale` `[N]` the weight_scale of each output row (None: online)."""
    if quant == "none":
        return kernels.linear_act(x, weight)
    s = 127.0 / x.abs().amax(-1, keepdim=True).clamp(min=1e-5).float()
    q = (x.float() * s).round().clamp(-128, 127)
    if quant == "bitlinear":
        y = kernels.linear_act(q.to(x.dtype), weight)
        return (y.float() / (scale.float() * s.to(x.dtype).float())).to(x.dtype)
    y = kernels.linear_act((q / s).to(x.dtype), weight)
    return y if scale is None else y * scale


class BitNetDecoder(TransformerDecoder):
    LINEAR_WEIGHTS = ()

    def __init__(self, config: BitNetSpec, state: dict, device: torch.device, dtype: torch.dtype, tp=None):
        if tp is not None:
            config.check_split(tp)
        state = dict(state)
        scales: dict[str, torch.Tensor] = {}
        for name in list(state):
            if not name.endswith(".weight") or not any(name.endswith(f"{lin}.weight") for lin in LINEARS):
                continue
            base = name.removesuffix(".weight")
            if config.quant == "online":
                state[name] = quantize_online(state[name].to(device=device), dtype)
            elif config.quant != "none":
                if base + ".ternary_scale" not in state:
                    raise KeyError(f"checkpoint is missing weight {base + '.weight_scale'!r}")
                w = state[name].to(device=device)
                state[name] = unpack_ternary(w, dtype) if w.dtype == torch.uint8 else w.to(dtype)
                scales[base] = state[base + ".ternary_scale"].to(device=device, dtype=dtype).reshape(-1)[:1]
        super().__init__(config, state, device, dtype)
        c = config
        q_rows, kv_rows = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

        def rows(p: str, parts: list[tuple[str, int]]) -> torch.Tensor | None:
            if c.quant in ("none", "online"):
                return None
            return torch.cat([scales[p + lin].expand(n) for lin, n in parts]).contiguous()

        self.sub_norms, self.scales = [], []
        inter = c.intermediate_size
        for i in range(c.num_layers):
            p = self._prefix(state, i)
            self.sub_norms.append((self.weight(p + "self_attn.attn_sub_norm.weight"),
                                   self.weight(p + "mlp.ffn_sub_norm.weight")))
            self.scales.append((rows(p, [("self_attn.q_proj", q_rows), ("self_attn.k_proj", kv_rows),
                                         ("self_attn.v_proj", kv_rows)]),
                                rows(p, [("self_attn.o_proj", c.hidden_size)]),
                                rows(p, [("mlp.gate_proj", inter), ("mlp.up_proj", inter)]),
                                rows(p, [("mlp.down_proj", c.hidden_size)])))

    @staticmethod
    def _prefix(state: dict, i: int) -> str:
        for name in state:
            at = name.find(f"layers.{i}.")
            if at >= 0 and (at == 0 or name[at - 1] == "."):
                return name[:at] + f"layers.{i}."
        raise KeyError(f"checkpoint has no tensors of layer {i}")

    @torch.inference_mode()
    def hidden_states(self, batch: DecoderBatch, cache: PagedKVCache) -> torch.Tensor:
        """The layers unfused: norm, quantised QKV (cache write and rotary: kernels.qkv_to_cache), attention,
        the sub norm, the output projection; norm, quantised gate/up, relu(gate)^2 * up in the activation
        dtype, the sub norm, the down projection; every op over all rows at once."""
        c, eps, quant = self.config, self.config.norm_eps, self.config.quant
        table = self.rope_cos_sin[batch.positions]
        cos, sin = table[:, 0], table[:, 1]
        residual = self._embed(batch.input_ids)
        h = None
        inter = c.intermediate_size
        for li, layer in enumerate(self.layers):
            attn_sub, ffn_sub = self.sub_norms[li]
            qkv_s, o_s, gu_s, down_s = self.scales[li]
            x, residual = kernels.rms_norm(residual if h is None else h, layer.attn_norm, eps,
                                           None if h is None else residual)
            qkv = bit_linear(x, layer.qkv_w, qkv_s, quant)
            q = kernels.qkv_to_cache(qkv, None, c.num_heads, c.num_kv_heads, c.head_dim, cos, sin,
                                     cache.keys(layer.kv_index), cache.values(layer.kv_index), batch.slot_mapping)
            ctx = batch.attention(q, cache.keys(layer.kv_index), cache.values(layer.kv_index), scale=c.attn_scale)
            ctx, _ = kernels.rms_norm(ctx.reshape(ctx.shape[0], -1), attn_sub, eps)
            h = bit_linear(ctx, layer.o_w, o_s, quant)
            x, residual = kernels.rms_norm(h, layer.mlp_norm, eps, residual)
            gu = bit_linear(x, layer.gate_up_w, gu_s, quant)
            a = torch.relu(gu[:, :inter]).square() * gu[:, inter:]
            a, _ = kernels.rms_norm(a, ffn_sub, eps)
            h = bit_linear(a, layer.down_w, down_s, quant)
        if not batch.logits_every_row:
            h, residual = h[batch.logits_index], residual[batch.logits_index]
        x, _ = kernels.rms_norm(h, self.final_norm, eps, residual)
        return x


MODEL = BitNetDecoder
