"""Mamba-1's token mixer (a selective state-space layer) for Mamba (mamba.py: state-spaces' mamba-130m .. 2.8b),
Falcon-Mamba (mamba.py) and Jamba's Mamba layers (jamba.py). It runs where the spec's `mixers[i]` is "mamba1"
(mixers.py has the contract).

For each token the input projection gives x and the gate z (`intermediate` wide each). x passes a depthwise
causal convolution of `conv_kernel` taps and SiLU (mixers.causal_conv1d, over the last `conv_kernel - 1` inputs
it saw). x_proj maps it to a low-rank dt (`dt_rank` wide), B and C (`state` wide each); Falcon-Mamba and Jamba
RMS-normalise each of the three (`bcdt_norm`: without a weight, Falcon-Mamba's `mixer_rms_eps`; with one, Jamba's
`dt_layernorm` / `b_layernorm` / `c_layernorm`). dt_proj maps dt to one value per channel, and per channel c and
state n, with dt = softplus(dt_proj(dt) + dt_bias) and A = -exp(A_log) `[intermediate, state]`:

    h_t[c, n] = exp(dt_t[c] A[c, n]) h_{t-1}[c, n] + dt_t[c] x_t[c] B_t[n]      (h: [intermediate, state], fp32)
    y_t[c] = (sum_n h_t[c, n] C_t[n] + D[c] x_t[c]) * silu(z_t[c])

and the output projection maps y back to the hidden size.

A sequence's state is its conv inputs `[intermediate, conv_kernel - 1]` and h `[intermediate, state]`, both fp32.
Decode rows take one step together, one kernel reading and writing each row's h at its slot
(kernels.selective_scan_decode: no host sync, as a captured graph needs). A prompt chunk runs the same
recurrence as a scan over its tokens from its slot's state, one op that reads and writes the slot
(kernels.selective_scan_chunk): within a block of tokens the pairs (decay, input) compose associatively, (a1, b1)
then (a2, b2) = (a1 a2, a2 b1 + b2), so log2(block) steps give every token's h (Hillis and Steele's prefix scan),
the block's last h carried to the next.

Rounding, as Hugging Face's torch path (its "slow" scan) rounds: the conv in the model's dtype (here summed in
fp32 and rounded once), x_proj and dt_proj's product in the model's dtype (dt_proj's bias added in fp32), the
B / C / dt norms in fp32 rounded to the model's dtype (then times Jamba's weight); softplus and the scan in fp32;
h C with h rounded to the model's dtype; silu(z) in the model's dtype; (h C + D x) silu(z) in fp32, rounded
once before out_proj. Hugging Face's one-token step rounds differently (dt and D x in the model's dtype): the two
agree in fp32. Refused by name: an activation other than SiLU, a conv of fewer than 2 taps.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.models.mixers import HeadShare, causal_conv1d, merged
from tritonformer.backend.models.rope import Rope
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames
from tritonformer.backend.parallel.group import adds_biases

KIND = "mamba1"  # the mixer kind a family's spec names (DecoderSpec.mixers)


@dataclass(frozen=True)
class Mamba1Spec:
    """A model's Mamba-1 layers' sizes and options (the same in every such layer), from its config."""
    intermediate_size: int
    state_size: int
    dt_rank: int
    conv_kernel: int = 4
    conv_bias: bool = True
    proj_bias: bool = False  # biases on in_proj and out_proj
    # RMSNorms on dt, B, C after x_proj: "none", "weightless" (Falcon-Mamba), "weighted" (Jamba)
    bcdt_norm: str = "none"
    bcdt_norm_eps: float = 1e-6

    def __post_init__(self):
        if self.conv_kernel < 2:
            raise ValueError(f"Mamba conv_kernel {self.conv_kernel} is not supported (supported: conv_kernel >= 2)")
        if self.bcdt_norm not in ("none", "weightless", "weighted"):
            raise ValueError(f"Mamba dt / B / C norm {self.bcdt_norm!r} is not supported (supported: none, "
                             f"weightless, weighted)")


def tensor_shapes(spec: Mamba1Spec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """A Mamba-1 layer's checkpoint tensors under `prefix` (e.g. "layers.0.mixer.")."""
    s, inner = spec, spec.intermediate_size
    shapes = {"in_proj.weight": (2 * inner, hidden), "conv1d.weight": (inner, 1, s.conv_kernel),
              "x_proj.weight": (s.dt_rank + 2 * s.state_size, inner), "dt_proj.weight": (inner, s.dt_rank),
              "dt_proj.bias": (inner,), "A_log": (inner, s.state_size), "D": (inner,),
              "out_proj.weight": (hidden, inner)}
    if s.conv_bias:
        shapes["conv1d.bias"] = (inner,)
    if s.proj_bias:
        shapes.update({"in_proj.bias": (2 * inner,), "out_proj.bias": (hidden,)})
    if s.bcdt_norm == "weighted":
        shapes.update({"dt_layernorm.weight": (s.dt_rank,), "b_layernorm.weight": (s.state_size,),
                       "c_layernorm.weight": (s.state_size,)})
    return {prefix + name: shape for name, shape in shapes.items()}


def split(spec: Mamba1Spec, tp) -> tuple[Mamba1Spec, HeadShare]:
    """This rank's layer sizes under tensor parallelism `tp` (or None) and its share of the channels."""
    channels = HeadShare.of(tp, spec.intermediate_size, "Mamba-1 channels (intermediate_size)")
    return replace(spec, intermediate_size=channels.count), channels


class Mamba1Mixer:
    def __init__(self, spec: Mamba1Spec, prefix: str, hidden: int, weight, tp=None):
        """Layer weights under `prefix` ("layers.{i}.mixer."), read by `weight(name, *shape, rows=, cols=)` (the
        decoder's: checked, on the device in the model's dtype). With `tp`, this rank's channels: their rows of
        x and z, of the convolution, dt_proj and the state, their columns of x_proj (whose partial dt, B and C
        the ranks sum: one all-reduce in the layer) and of out_proj (whose bias rank 0 adds)."""
        whole = spec
        s, channels = split(spec, tp)
        self.spec, self.tp = s, tp if not channels.whole else None
        inner, own = whole.intermediate_size, channels.rows(1)
        in_rows = merged([own, channels.rows(1, inner)])
        self.in_w = weight(prefix + "in_proj.weight", 2 * inner, hidden, rows=in_rows)
        self.in_b = weight(prefix + "in_proj.bias", 2 * inner, rows=in_rows) if s.proj_bias else None
        self.conv_w = weight(prefix + "conv1d.weight", inner, 1, s.conv_kernel, rows=own)[:, 0]
        self.conv_b = weight(prefix + "conv1d.bias", inner, rows=own) if s.conv_bias else None
        self.x_w = weight(prefix + "x_proj.weight", s.dt_rank + 2 * s.state_size, inner, cols=own)
        self.dt_w = weight(prefix + "dt_proj.weight", inner, s.dt_rank, rows=own)
        self.dt_bias = weight(prefix + "dt_proj.bias", inner, rows=own).float()  # (added in fp32, as HF adds it)
        self.A = -torch.exp(weight(prefix + "A_log", inner, s.state_size, rows=own).float()).contiguous()
        self.D = weight(prefix + "D", inner, rows=own).float()
        self.out_w = weight(prefix + "out_proj.weight", hidden, inner, cols=own)
        self.out_b = (weight(prefix + "out_proj.bias", hidden) if s.proj_bias and adds_biases(tp)
                      else None)
        self.norm_w = None  # Jamba's dt, B and C norms' weights, end to end (kernels.segment_rms_norms)
        if s.bcdt_norm == "weighted":
            self.norm_w = torch.cat([weight(prefix + name, size) for name, size in (
                ("dt_layernorm.weight", s.dt_rank), ("b_layernorm.weight", s.state_size),
                ("c_layernorm.weight", s.state_size))])
        self.state_shapes = {"conv": (s.intermediate_size, s.conv_kernel - 1),
                             "ssm": (s.intermediate_size, s.state_size)}

    def __call__(self, x: torch.Tensor, pre, batch: DecoderBatch, state: dict[str, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        inner = s.intermediate_size
        xz = kernels.linear_act(x, self.in_w, self.in_b, prenorm=pre)  # (the layer's norm in its prologue)
        xs, z = xz.split([inner, inner], dim=-1)
        xs = causal_conv1d(xs, self.conv_w, self.conv_b, batch, state["conv"], "silu")
        dbc = kernels.linear_act(xs, self.x_w)
        if self.tp is not None:  # each rank's channels' share of dt, B and C
            dbc = self.tp.all_reduce(dbc)
        sizes = (s.dt_rank, s.state_size, s.state_size)
        if s.bcdt_norm != "none":  # the three norms in one launch, each output contiguous
            dt, b, c = kernels.segment_rms_norms(dbc, sizes, s.bcdt_norm_eps, self.norm_w)
        else:
            dt, b, c = dbc.split(sizes, dim=-1)
            dt = dt.contiguous()
        dt = kernels.linear_act(dt, self.dt_w)  # [T, I]: dt before its bias
        d, ssm = batch.num_decode, state["ssm"]
        if d and d == xs.shape[0]:  # decode rows only (a decode graph's step): the scan's output is y, no copy
            return kernels.linear_act(kernels.selective_scan_decode(xs, dt, b, c, z, self.dt_bias, self.A, self.D,
                                                                    ssm, batch.state_slots[:d]), self.out_w, self.out_b)
        y = torch.empty_like(xs)
        if d:  # one step of every decoding sequence, its state read and written at its slot: one kernel
            y[:d] = kernels.selective_scan_decode(xs[:d], dt[:d], b[:d], c[:d], z[:d], self.dt_bias, self.A, self.D,
                                                  ssm, batch.state_slots[:d])
        row = d
        for j, n in enumerate(batch.prefill_lens):  # each prompt chunk: one op from its slot's state, written back
            part = slice(row, row + n)
            kernels.selective_scan_chunk(xs[part], dt[part], b[part], c[part], z[part], self.dt_bias, self.A, self.D,
                                         ssm, batch.state_slots[d + j : d + j + 1], y[part])
            row += n
        return kernels.linear_act(y, self.out_w, self.out_b)


@dataclass(frozen=True)
class Mamba1HybridSpec(DecoderSpec):
    """The shared decoder's spec with the sizes of its Mamba-1 layers (those whose `mixers` kind is KIND)."""
    mamba1: Mamba1Spec | None = None
    mixer_prefix: str = "mixer."  # where a Mamba-1 layer keeps its tensors, relative to `layers.{i}.`

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A Mamba-1 layer's checkpoint tensors by name (client/model_shapes.tensor_shapes)."""
        return tensor_shapes(self.mamba1, prefix + self.mixer_prefix, self.hidden_size)

    def split_mixers(self, tp) -> None:
        split(self.mamba1, tp)


def mamba1_spec(spec: DecoderSpec, mamba1: Mamba1Spec, mixer_prefix: str = "mixer.") -> Mamba1HybridSpec:
    """`spec` (a family's, with its `mixers`) with its Mamba-1 layers' sizes."""
    if KIND not in spec.mixers:
        raise ValueError("a Mamba-1 spec names its Mamba-1 layers in `mixers`")
    return Mamba1HybridSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)}, mamba1=mamba1,
                            mixer_prefix=mixer_prefix)


# The longest sequence of an attention-free model whose config names none (Mamba's do not): its state does not grow
# with the sequence, so the length only sizes the scheduler's block tables; max_model_len caps it lower.
DEFAULT_MAX_POSITIONS = 32768


def attention_free_spec(cfg: dict, mixer: str, names: WeightNames, tie_default: bool = True) -> DecoderSpec:
    """The shared decoder's spec of a model whose every layer is x + mixer(RMSNorm(x)), the mixer of kind `mixer`:
    no attention (the KV cache holds no layer), no MLP, no rotary (its sizes are placeholders: 1 head of 2).
    `tie_default`: whether the head is tied where the config does not say."""
    layers = cfg["num_hidden_layers"]
    longest = cfg.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS
    eos = cfg.get("eos_token_id")
    return DecoderSpec(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=0, num_layers=layers,
        num_heads=1, num_kv_heads=1, head_dim=2, norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        rope=Rope.from_hf(None, 10000.0, longest), max_position_embeddings=longest,
        tie_word_embeddings=cfg.get("tie_word_embeddings", tie_default), bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        mixers=(mixer,) * layers, mlp_layers=(False,) * layers, rope_layers=(False,) * layers, names=names)


def mamba_ssm_config(cfg: dict) -> dict:
    """A config.json in state-spaces' own format (the `mamba_ssm` package's MambaConfig: `d_model`, `n_layer`,
    `ssm_cfg`; state-spaces/mamba-2.8b, mamba2-2.7b) as transformers' `mamba` / `mamba2` config of the same model: the
    vocabulary padded to `pad_vocab_size_multiple` (the checkpoint's embedding rows), the mixer's defaults as
    mamba_ssm's (Mamba-1: state 16; Mamba-2: state 128, heads of 64, one group). Refused by name: attention layers
    (`attn_layer_idx`), MLPs (`d_intermediate`), LayerNorms (`rms_norm` false) and Mamba-2's `d_ssm` / `D_has_hdim`."""
    ssm = dict(cfg.get("ssm_cfg") or {})
    layer = ssm.pop("layer", "Mamba1")
    if cfg.get("attn_layer_idx"):
        raise ValueError("mamba_ssm attn_layer_idx: attention layers are not supported (supported: attn_layer_idx "
                         "empty, every layer Mamba)")
    if cfg.get("d_intermediate"):
        raise ValueError("mamba_ssm d_intermediate: MLPs are not supported (supported: d_intermediate 0)")
    if not cfg.get("rms_norm", True):
        raise ValueError("mamba_ssm rms_norm false (LayerNorms) is not supported (supported: rms_norm true)")
    if layer not in ("Mamba1", "Mamba2"):
        raise ValueError(f"mamba_ssm layer {layer!r} is not supported (supported: layer Mamba1, Mamba2)")
    for name in ("d_ssm", "D_has_hdim"):
        if ssm.get(name):
            raise ValueError(f"mamba_ssm {name} is not supported (supported: {name} unset)")
    multiple = cfg.get("pad_vocab_size_multiple", 1)
    vocab = -(-cfg["vocab_size"] // multiple) * multiple
    out = {"hidden_size": cfg["d_model"], "num_hidden_layers": cfg["n_layer"], "vocab_size": vocab,
           "tie_word_embeddings": cfg.get("tie_embeddings", True), "layer_norm_epsilon": cfg.get("norm_epsilon", 1e-5),
           "expand": ssm.get("expand", 2), "conv_kernel": ssm.get("d_conv", 4),
           "use_conv_bias": ssm.get("conv_bias", True), "use_bias": ssm.get("bias", False),
           "eos_token_id": 0, "bos_token_id": 0, "pad_token_id": 0}  # (GPT-NeoX's tokenizer, which they use)
    if layer == "Mamba1":
        return {**out, "model_type": "mamba", "state_size": ssm.get("d_state", 16),
                "time_step_rank": ssm.get("dt_rank", "auto")}
    heads = out["expand"] * cfg["d_model"] // ssm.get("headdim", 64)
    return {**out, "model_type": "mamba2", "state_size": ssm.get("d_state", 128), "head_dim": ssm.get("headdim", 64),
            "num_heads": heads, "n_groups": ssm.get("ngroups", 1), "chunk_size": ssm.get("chunk_size", 256),
            "norm_before_gate": ssm.get("norm_before_gate", False), "rms_norm": ssm.get("rmsnorm", True),
            "time_step_limit": tuple(ssm.get("dt_limit", (0.0, float("inf"))))}


def backbone_renamed(state: dict) -> dict:
    """A Mamba checkpoint's tensors without the `backbone.` prefix, the embeddings as Hugging Face names them
    (`embeddings`; the original checkpoints' `embedding`)."""
    out = {}
    for name, t in state.items():
        name = name.removeprefix("backbone.")
        out["embeddings.weight" if name == "embedding.weight" else name] = t
    return out


class Mamba1Decoder(TransformerDecoder):
    """The shared decoder whose KIND layers run a Mamba1Mixer (a Mamba1HybridSpec's `mamba1`, its tensors under
    `mixer_prefix`)."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        c = self.config
        if c.mixer(i) != KIND:
            return super().load_mixer(i, prefix, weight, read)
        return Mamba1Mixer(c.mamba1, prefix + c.mixer_prefix, c.hidden_size, weight, self.tp)
