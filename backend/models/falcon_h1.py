"""Falcon-H1 (`falcon_h1`: TII's Falcon-H1 0.5B to 34B): a parallel hybrid. Every layer runs attention (Llama's,
rotary over whole heads; biases where `attention_bias`) and Mamba-2 (mamba2.py) side by side on one RMSNorm's
output and adds both to the residual stream (DecoderSpec.parallel_mixers), then a SwiGLU MLP (`feed_forward`,
biases where `mlp_bias`) after `pre_ff_layernorm`; the final norm is `final_layernorm`.

Its muP multipliers are scalars on linear maps, folded into the weights at load (each rounded once to the
model's dtype, as granite.py folds its residual multiplier): `attention_in_multiplier` on the Q, K and V
weights (not their biases: it scales their input), `key_multiplier` on K's rows and bias,
`attention_out_multiplier` on the output projection, `mlp_multipliers` (gate, down) on the gate's rows and the
down projection, `ssm_in_multiplier` on the Mamba input projection's weight and `ssm_multipliers` on its rows
of z, x, B, C and dt (the mup vector; biases too), `ssm_out_multiplier` on its output projection;
`embedding_multiplier` and `lm_head_multiplier` are the decoder's embedding and logit scales. The Mamba layer's
norm follows `mamba_rms_norm` / `mamba_norm_before_gate` (Mamba2Spec.norm); its intermediate width is
`mamba_d_ssm` (else `mamba_expand` x hidden); its output projection's bias `projectors_bias`. transformers
multiplies the activations in the model's dtype instead: a rounding apart in bf16, none in fp32."""
from dataclasses import dataclass, fields

import torch

from tritonformer.backend.models.mamba2 import KIND, HybridSpec, Mamba2Decoder, Mamba2Spec, hybrid_spec
from tritonformer.backend.models.transformer import DecoderSpec, WeightNames, spec_from_hf

NAMES = WeightNames(gate="feed_forward.gate_proj", up="feed_forward.up_proj", down="feed_forward.down_proj",
                    mlp_norm="pre_ff_layernorm", final_norm="final_layernorm.weight")


@dataclass(frozen=True)
class FalconH1Spec(HybridSpec):
    """The hybrid spec with Falcon-H1's multipliers (folded into the weights at load: FalconH1Decoder)."""
    attention_in_multiplier: float = 1.0
    key_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)  # (gate, down)
    ssm_in_multiplier: float = 1.0
    ssm_multipliers: tuple[float, ...] = (1.0,) * 5  # (z, x, B, C, dt)
    ssm_out_multiplier: float = 1.0


def _mamba(cfg: dict) -> Mamba2Spec:
    inter = cfg.get("mamba_d_ssm") or int(cfg.get("mamba_expand", 2) * cfg["hidden_size"])
    heads = cfg.get("mamba_n_heads", 128)
    head_dim = cfg.get("mamba_d_head", "auto")
    limit = cfg.get("time_step_limit") or (0.0, float("inf"))
    if not cfg.get("mamba_rms_norm", False):
        norm = "none"
    else:
        norm = "before_gate" if cfg.get("mamba_norm_before_gate", True) else "gated"
    return Mamba2Spec(num_heads=heads, head_dim=inter // heads if head_dim in (None, "auto") else head_dim,
                      state_size=cfg.get("mamba_d_state", 256), num_groups=cfg.get("mamba_n_groups", 1),
                      intermediate_size=inter, conv_kernel=cfg.get("mamba_d_conv", 4),
                      chunk_size=cfg.get("mamba_chunk_size") or 256, conv_bias=bool(cfg.get("mamba_conv_bias", True)),
                      proj_bias=bool(cfg.get("mamba_proj_bias", False)), norm_eps=cfg.get("rms_norm_eps", 1e-5),
                      time_step_limit=(float(limit[0]), float(limit[1])), norm=norm,
                      out_bias=bool(cfg.get("projectors_bias", False)))


def from_hf(cfg: dict) -> DecoderSpec:
    if cfg.get("hidden_act", "silu") != "silu":  # (the MLP's and the Mamba conv's activation)
        raise ValueError(f"unsupported Falcon-H1 hidden_act {cfg['hidden_act']!r} (supported: silu)")
    for key, size in (("mlp_multipliers", 2), ("ssm_multipliers", 5)):
        if cfg.get(key) is not None and len(cfg[key]) != size:
            raise ValueError(f"Falcon-H1 {key} lists {len(cfg[key])} multipliers, {size} expected")
    bias = bool(cfg.get("attention_bias", False))
    layers = cfg["num_hidden_layers"]
    spec = spec_from_hf(cfg, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bias, o_bias=bias,
                        mixers=(KIND,) * layers, parallel_mixers=True, names=NAMES,
                        embed_scale=float(cfg.get("embedding_multiplier", 1.0)),
                        logit_scale=float(cfg.get("lm_head_multiplier", 1.0)))
    hybrid = hybrid_spec(spec, _mamba(cfg))
    scalars = {key: float(cfg.get(key, 1.0)) for key in ("attention_in_multiplier", "key_multiplier",
                                                          "attention_out_multiplier", "ssm_in_multiplier",
                                                          "ssm_out_multiplier")}
    return FalconH1Spec(**{f.name: getattr(hybrid, f.name) for f in fields(hybrid)}, **scalars,
                        mlp_multipliers=tuple(map(float, cfg.get("mlp_multipliers") or (1.0, 1.0))),
                        ssm_multipliers=tuple(map(float, cfg.get("ssm_multipliers") or (1.0,) * 5)))


class FalconH1Decoder(Mamba2Decoder):
    """Mamba2Decoder with Falcon-H1's multipliers (FalconH1Spec) folded into the loaded weights (see the module's
    docstring)."""

    def __init__(self, config: FalconH1Spec, state, device, dtype, tp=None):
        super().__init__(config, state, device, dtype, tp=tp)
        c = self.config
        attn_in, key, attn_out = c.attention_in_multiplier, c.key_multiplier, c.attention_out_multiplier
        gate_mult, down_mult = c.mlp_multipliers
        q_rows, kv_rows = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        for layer in self.layers:
            bias_rows = torch.ones(layer.qkv_w.shape[0], device=device)
            bias_rows[q_rows : q_rows + kv_rows] = key  # (K's bias: key_multiplier alone; Q's, V's as they are)
            layer.qkv_w = _scaled_rows(layer.qkv_w, bias_rows * attn_in)
            layer.qkv_b = _scaled_rows(layer.qkv_b, bias_rows)
            layer.o_w, layer.o_b = _scaled(layer.o_w, attn_out), _scaled(layer.o_b, attn_out)
            inter = layer.gate_up_w.shape[0] // 2
            gate_rows = torch.ones(2 * inter, device=device)
            gate_rows[:inter] = gate_mult
            layer.gate_up_w = _scaled_rows(layer.gate_up_w, gate_rows)
            layer.gate_up_b = _scaled_rows(layer.gate_up_b, gate_rows)
            layer.down_w, layer.down_b = _scaled(layer.down_w, down_mult), _scaled(layer.down_b, down_mult)

    def load_mixer(self, i: int, prefix: str, weight, read):
        """The Mamba layer with its input projection's rows times the mup vector (its weight times
        ssm_in_multiplier too) and its output projection times ssm_out_multiplier."""
        mixer = super().load_mixer(i, prefix, weight, read)
        c, s = self.config, mixer.spec  # (this rank's sizes under tensor parallelism)
        sizes = (s.intermediate_size, s.intermediate_size, s.num_groups * s.state_size, s.num_groups * s.state_size,
                 s.num_heads)
        mup = torch.cat([torch.full((n,), f) for n, f in zip(sizes, c.ssm_multipliers)]).to(mixer.in_w.device)
        mixer.in_w = _scaled_rows(mixer.in_w, mup * c.ssm_in_multiplier)
        mixer.in_b = _scaled_rows(mixer.in_b, mup)
        out = c.ssm_out_multiplier
        mixer.out_w, mixer.out_b = _scaled(mixer.out_w, out), _scaled(mixer.out_b, out)
        return mixer


def _scaled(t: torch.Tensor | None, factor: float) -> torch.Tensor | None:
    """t times `factor`, rounded once to t's dtype (None: None)."""
    return t if t is None or factor == 1.0 else (t.float() * factor).to(t.dtype)


def _scaled_rows(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """t's rows (a weight's, or a bias's entries) times `rows` (fp32), rounded once to t's dtype (None: None)."""
    if t is None:
        return None
    return (t.float() * (rows[:, None] if t.dim() == 2 else rows)).to(t.dtype)


MODEL = FalconH1Decoder
