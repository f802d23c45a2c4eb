"""FP8 (E4M3) linears at load: which weights become FP8, reading FP8 checkpoints, and what the
GPU must have (config parameter `quantization`: none | fp8).

Two ways a model gets FP8 linears (kernels/fp8.py has the weight type and how the linear ops
run it):

* `quantization: fp8` on a 16-bit checkpoint: after the model is built, each layer's linear
  weights (the family's LINEAR_WEIGHTS: a decoder's QKV, output, gate/up and down projections,
  an encoder's QKV, attention output and FFN) are quantised per output channel (amax / 448),
  one tensor at a time. Embeddings, norms, biases, classification heads and the decoder's
  output head stay 16-bit (the head: `quantize_model(head=True)` to try it), and so do a
  decoder's and a BERT encoder's first and last layers (FP8_KEEP_EDGE_LAYERS; all-MiniLM-L6-v2's
  embedding cosine 0.99469 -> 0.99708 by keeping them, models/bert.py). Measured on
  SmolLM2-135M (CPU, fp32 activations, tests/data/fp8_eval.txt's perplexity): every layer in
  FP8 +3.4%, weight-only FP8 alone +2.2% (E4M3's 3 mantissa bits: 2.6% RMS error per weight,
  whatever the scale); the last layer kept 16-bit +1.7%, the first +3.2%, both +1.4%. On Llama-3.1-8B's shape
  the two are 2/32 of the layer bytes.
* an FP8 checkpoint, whatever the parameter: the common format of published FP8 Llama / Qwen
  checkpoints, E4M3 weights with a `weight_scale` beside each (per tensor or per output
  channel), loads as FP8 as stored (`prepare`: no dequantise-requantise round trip; fused
  projections concatenate their parts' values and scales). A static `input_scale` is ignored:
  activations are quantised per token at run time, which is never less accurate. Linears the
  checkpoint keeps in 16 bits stay so unless the parameter asks for fp8. Block-wise scales
  (`weight_scale_inv`, DeepSeek's and Qwen3's official FP8 format) are refused, by name.

With tensor parallelism `quantization: fp8` quantises each rank's own slices after its share is
built: a column-parallel weight's rows (QKV, gate/up) get the scales TP=1 would give them; a
row-parallel weight's (output, down) get each its own slice's amax, no coarser than the whole
row's, and each rank's partial product is dequantised before the all-reduce sums them. An FP8
checkpoint splits as stored: each rank reads its slice of the E4M3 values and the scales that
belong to it (a column-parallel share its rows' per-channel scales, a row-parallel share all of
them; a per-tensor scale whole), so every rank holds exactly TP=1's values (Fp8Slices).
A GPU of compute capability below 8.9 (no FP8 arithmetic) is a load error for both. On the CPU
the linear ops run their references, which dequantise on every call: for tests.
"""
from __future__ import annotations

import logging

import torch

from tritonformer.kernels import fp8
from tritonformer.kernels.fp8 import Fp8Weight, quantize_weight

log = logging.getLogger("tritonformer")

QUANTIZATIONS = ("none", "fp8")
# Names of checkpoint tensors kept 16-bit even when the checkpoint stores them in FP8 (their
# ops are lookups, or the output head, which reads logits' precision): dequantised at load.
_NEVER_FP8 = ("embed", "lm_head", "wte", "wpe", "word_embeddings", "position_embeddings", "token_type_embeddings")


def parse(value: str) -> str:
    """The parameter's value, checked: "none" or "fp8"."""
    v = (value or "none").strip().lower()
    if v not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")
    return v


def is_fp8_checkpoint(state: dict) -> bool:
    """Whether the checkpoint stores FP8 weights with their scales (`*.weight_scale`, or the
    block-wise `*.weight_scale_inv`, which `prepare` refuses)."""
    return any(name.endswith((".weight_scale", ".weight_scale_inv")) for name in state)


def prepare(state: dict, quantization: str, device: torch.device, dtype: torch.dtype,
            tensor_parallel: bool = False) -> tuple[dict, bool]:
    """Before a model is built from `state`: the parameter checked, an FP8 checkpoint's weights
    turned into Fp8Weights (see the module docstring), the GPU checked. Returns (the state to
    build from, whether `quantize_model` must quantise the 16-bit linears afterwards)."""
    value = parse(quantization)
    stored = is_fp8_checkpoint(state)
    if value == "none" and not stored:
        return state, False
    what = "an FP8 checkpoint" if stored else "quantization fp8"
    fp8.check_device(device)
    if device.type == "cuda" and fp8.scaled_mm_dtype(device, dtype) is None:
        log.warning("this GPU has no row-wise FP8 GEMM in torch %s for %s activations: linears of more than %d rows "
                    "dequantise their weights (slow)", torch.__version__, dtype, fp8.WEIGHT_ONLY_MAX_ROWS)
    if device.type == "cpu":
        log.warning("%s on the CPU runs the reference ops, which dequantise every weight on every call", what)
    return (fp8_state(state, dtype, sliced=tensor_parallel) if stored else state), value == "fp8"


class Fp8Slices:
    """An FP8 checkpoint weight that a tensor-parallel rank reads in part: its E4M3 values and
    `weight_scale` (unread LazyTensors), indexed as the family's build indexes a weight (rows:
    a column-parallel share, which takes its rows' per-channel scales; rows and columns: a
    row-parallel share, all of them; a per-tensor scale whole). The slice's `.to(device=...,
    dtype=...)` is the Fp8Weight, or with `dequantize` (an embedding or head stored in FP8) the
    16-bit tensor."""

    def __init__(self, data, scale, dtype: torch.dtype, dequantize: bool = False):
        self.data, self.scale, self.serve_dtype, self.dequantize = data, scale, dtype, dequantize
        self.shape = tuple(data.shape)

    def __getitem__(self, index) -> "Fp8Slices":
        rows = index[0] if isinstance(index, tuple) else index
        scale = self.scale.to(torch.float32).reshape(-1)  # (a LazyTensor's .to reads it whole)
        return Fp8Slices(self.data[index], scale[rows] if scale.numel() > 1 else scale, self.serve_dtype,
                         self.dequantize)

    def to(self, device=None, dtype=None):
        dtype = dtype or self.serve_dtype
        weight = fp8.from_checkpoint(self.data.to(device), self.scale.to(device), dtype)
        return weight.dequantize(dtype) if self.dequantize else weight


def fp8_state(state: dict, dtype: torch.dtype, sliced: bool = False) -> dict:
    """An FP8 checkpoint's tensors with each E4M3 weight and its `weight_scale` as one Fp8Weight
    (on the CPU, serving `dtype`: a model's weight getter moves it), `input_scale`s dropped, and
    embeddings / output heads stored in FP8 dequantised to `dtype`. With `sliced` (a tensor-
    parallel rank's unread state) each weight stays unread as Fp8Slices, to be read in part."""
    out = dict(state)
    blockwise = [n for n in out if n.endswith(".weight_scale_inv")]
    if blockwise:
        raise ValueError(f"block-wise FP8 scales ({blockwise[0]!r}, ...) are not supported: this FP8 format needs "
                         f"per-tensor or per-output-channel weight_scale")
    inputs = [n for n in out if n.endswith(".input_scale")]
    for name in inputs:
        del out[name]
    if inputs:
        log.info("FP8 checkpoint: %d static input_scale tensors ignored (activations are quantised per token at run "
                 "time)", len(inputs))
    for scale_name in [n for n in out if n.endswith(".weight_scale")]:
        name = scale_name[: -len("_scale")]
        data = out.get(name)
        if data is None:
            raise KeyError(f"FP8 checkpoint has {scale_name!r} but no {name!r}")
        if data.dtype != fp8.E4M3:
            raise ValueError(f"FP8 checkpoint tensor {name!r} is {data.dtype}: only float8_e4m3fn weights are "
                             f"supported")
        keep_16_bit = any(part in name for part in _NEVER_FP8)
        if sliced:
            out[name] = Fp8Slices(data, out.pop(scale_name), dtype, dequantize=keep_16_bit)
            continue
        weight = fp8.from_checkpoint(data, out.pop(scale_name), dtype)
        out[name] = weight.dequantize(dtype) if keep_16_bit else weight
    unscaled = [n for n, t in out.items()
                if not isinstance(t, Fp8Slices) and getattr(t, "dtype", None) in (fp8.E4M3, torch.float8_e5m2)]
    if unscaled:
        raise ValueError(f"FP8 checkpoint tensor {unscaled[0]!r} has no weight_scale beside it")
    return out


def quantize_model(model, head: bool = False, keep_edge_layers: bool | None = None):
    """Quantise a built model's 16-bit linear weights in place: every layer's LINEAR_WEIGHTS (a
    family class attribute naming them; FP8 ones already loaded are kept) but the first and last
    layers' where `keep_edge_layers` (default: the class's FP8_KEEP_EDGE_LAYERS) says so and
    there are more than two, and with `head` a decoder's output head. Each 16-bit tensor is
    freed as its FP8 copy replaces it. Returns the model."""
    names = getattr(type(model), "LINEAR_WEIGHTS", None)
    if names is None:
        raise ValueError(f"quantization fp8 is not supported for {type(model).__name__} (supported: the Llama-family "
                         f"decoders, BERT and ModernBERT encoders)")
    layers = list(model.layers)
    if keep_edge_layers is None:
        keep_edge_layers = getattr(type(model), "FP8_KEEP_EDGE_LAYERS", False)
    if keep_edge_layers and len(layers) > 2:
        layers = layers[1:-1]
    for layer in layers:
        for name in names:
            as_dict = isinstance(layer, dict)
            weight = layer[name] if as_dict else getattr(layer, name)
            if isinstance(weight, Fp8Weight):
                continue
            quantized = quantize_weight(weight)
            if as_dict:
                layer[name] = quantized
            else:
                setattr(layer, name, quantized)
            del weight
    if head and not isinstance(model.output_head, Fp8Weight):
        model.output_head = quantize_weight(model.output_head)
    return model


def linear_bytes(model) -> int:
    """Bytes of the layers' linear weights as stored (FP8: values and scales)."""
    total = 0
    for layer in model.layers:
        for name in type(model).LINEAR_WEIGHTS:
            w = layer[name] if isinstance(layer, dict) else getattr(layer, name)
            total += w.nbytes() if isinstance(w, Fp8Weight) else w.numel() * w.element_size()
    return total


def load_encoder(hf_config: dict, state: dict, device: torch.device, dtype: torch.dtype, quantization: str = "none",
                 score_token_ids: tuple[int, ...] = ()):
    """models.encoder.load_encoder with the parameter `quantization` (and FP8 checkpoints)
    applied: what the encoder models, tests and tools build an encoder with."""
    from tritonformer.backend.models.encoder import load_encoder as build

    state, quantize = prepare(state, quantization, device, dtype)
    model = build(hf_config, state, device, dtype, score_token_ids)
    return quantize_model(model) if quantize else model
