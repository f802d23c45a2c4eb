"""xLSTM (`xlstm`: NX-AI's xLSTM-7b): an attention-free decoder of mLSTM blocks, each
x + mLSTM(RMSNorm(x)) (mlstm.py), then x + SwiGLU-MLP(RMSNorm(x)), then a final RMSNorm, an untied head and the
logits soft-capped in fp32 (`output_logit_soft_cap`: cap * tanh(logits / cap)). The head is never tied to the
embeddings: transformers' xLSTM keeps `lm_head` its own whatever `tie_word_embeddings` says.

Tensors (`backbone.` stripped, `blocks.{i}.` read as `layers.{i}.`): `embeddings`, `layers.{i}.norm_mlstm`,
`layers.{i}.mlstm_layer.*` (mlstm.tensor_shapes), `layers.{i}.norm_ffn`, `layers.{i}.ffn.proj_up_gate` /
`proj_up` / `proj_down` (weight_mode "fused": `proj_up_gate_z`, rows [gate; up]), `out_norm`, `lm_head`. The widths
as transformers reads them: q and k hidden * qk_dim_factor, v hidden * v_dim_factor (each a multiple of 64 and of
num_heads: transformers' cache rounds them up to 64, its layers do not, so other widths do not run there), the MLP
round_up(hidden * ffn_proj_factor, ffn_round_up_to_multiple_of). Every norm computes in fp32.

The model has no attention: the paged KV cache holds no layer and each sequence's whole memory is its mLSTM state.
The config names no longest sequence: mamba1.DEFAULT_MAX_POSITIONS, or `max_position_embeddings` where a config sets
it. Transformers runs a prompt longer than `max_inference_chunksize` in pieces, the state carried, as the
scheduler's prompt chunks are here: the same computation. Refused by name, what transformers' own (native) path does
not run or runs otherwise: `mode` other than inference, `return_last_states` false, kernels other than the native
ones and the xlstm package's Triton kernels that xLSTM-7b's config names (`chunkwise_kernel`
chunkwise--triton_xl_chunk, `sequence_kernel` native_sequence__triton, `step_kernel` triton: the same recurrence,
rounded otherwise, and served here by this file's; transformers without that package refuses those names, so the
published config loads here and not there), `inference_state_dtype` other than float32,
`norm_reduction_force_float32` false, `use_bias`, `add_out_norm` false (transformers applies the final norm whatever
it says), `embedding_dim` / `num_blocks` unlike hidden_size / num_hidden_layers, and tensor parallelism."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tritonformer.backend.models.mamba1 import attention_free_spec
from tritonformer.backend.models.mlstm import KIND, MlstmMixer, MlstmSpec, tensor_shapes
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, WeightNames

KERNELS = {"chunkwise_kernel": ("chunkwise--native_autograd", "parallel--native_autograd", "chunkwise--triton_xl_chunk"),
           "sequence_kernel": ("native_sequence__native", "native_sequence__triton"),
           "step_kernel": ("native", "triton")}
# (option: the kernels computing the recurrence this file computes, transformers' native ones first; others, such as
# the package's sigmoid input gate variants, are refused by name)
REQUIRED = (("mode", "inference"), ("return_last_states", True), ("inference_state_dtype", "float32"),
            ("norm_reduction_force_float32", True), ("use_bias", False), ("add_out_norm", True))


def _round_up(x: float, multiple: int) -> int:
    """x rounded up to a multiple of `multiple` (transformers' round_up_to_next_multiple_of, on a float)."""
    return int(((x + multiple - 1) // multiple) * multiple)


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The checkpoint's tensors as the shared decoder names them: `backbone.` stripped, `blocks.` as `layers.`."""
    out = {}
    for name, t in state.items():
        name = name.removeprefix("backbone.")
        out["layers." + name[len("blocks."):] if name.startswith("blocks.") else name] = t
    return cfg, out


@dataclass(frozen=True)
class XlstmSpec(DecoderSpec):
    """The shared decoder's spec with its mLSTM layers' sizes (every layer's mixer)."""
    mlstm: MlstmSpec | None = None

    def mixer_tensors(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """A layer's mLSTM tensors by name (client/model_shapes.tensor_shapes)."""
        return tensor_shapes(self.mlstm, prefix + "mlstm_layer.", self.hidden_size)

    def split_mixers(self, tp) -> None:
        raise ValueError("tensor parallelism is not supported for model_type 'xlstm' (its mLSTM layers do not split)")


def from_hf(cfg: dict) -> XlstmSpec:
    for name, value in REQUIRED:
        if cfg.get(name, value) != value:
            raise ValueError(f"unsupported xLSTM {name} {cfg[name]!r} (supported: {name} {value!r})")
    for name, supported in KERNELS.items():
        if cfg.get(name, supported[0]) not in supported:
            raise ValueError(f"unsupported xLSTM {name} {cfg[name]!r} (supported: {name} {' or '.join(supported)})")
    mode = cfg.get("weight_mode", "single")
    if mode not in ("single", "fused"):
        raise ValueError(f"unsupported xLSTM weight_mode {mode!r} (supported: weight_mode single or fused)")
    # (transformers' defaults where the config omits them; embedding_dim / num_blocks are other names of the same)
    hidden = cfg.get("hidden_size") or cfg.get("embedding_dim") or 4096
    layers = cfg.get("num_hidden_layers") or cfg.get("num_blocks") or 32
    for name, own, value in (("embedding_dim", "hidden_size", hidden), ("num_blocks", "num_hidden_layers", layers)):
        if cfg.get(name) not in (None, value):
            raise ValueError(f"unsupported xLSTM {name} {cfg[name]} unlike {own} {value} (supported: {name} equal "
                             f"to {own})")
    heads = cfg.get("num_heads", 8)
    widths = {}
    for name, default in (("qk_dim_factor", 0.5), ("v_dim_factor", 1.0)):
        width = hidden * cfg.get(name, default)
        if int(width) != _round_up(width, 64) or int(width) % heads:
            raise ValueError(f"unsupported xLSTM {name} {cfg.get(name, default)}: hidden_size {hidden} times it must "
                             f"be a multiple of 64 and of num_heads {heads} (supported: {name} giving such a width)")
        widths[name] = int(width)
    mlstm = MlstmSpec(num_heads=heads, qk_dim=widths["qk_dim_factor"], v_dim=widths["v_dim_factor"],
                      gate_soft_cap=cfg.get("gate_soft_cap", 15.0), eps=cfg.get("eps", 1e-6),
                      norm_eps=cfg.get("norm_eps", 1e-6), chunk_size=cfg.get("chunk_size", 64), fused=mode == "fused")
    names = WeightNames(attn_norm="norm_mlstm", mlp_norm="norm_ffn", gate="ffn.proj_up_gate", up="ffn.proj_up",
                        gate_up="ffn.proj_up_gate_z" if mode == "fused" else None, down="ffn.proj_down",
                        embed="embeddings.weight", final_norm="out_norm.weight")
    base = attention_free_spec({**cfg, "hidden_size": hidden, "num_hidden_layers": layers,
                                "vocab_size": cfg.get("vocab_size", 50304),
                                "eos_token_id": cfg.get("eos_token_id", 2), "bos_token_id": cfg.get("bos_token_id", 0)},
                               KIND, names, tie_default=False)
    inter = _round_up(hidden * cfg.get("ffn_proj_factor", 2.667), cfg.get("ffn_round_up_to_multiple_of", 64))
    # (the head its own whatever tie_word_embeddings says: transformers' xLSTM never ties it)
    base = replace(base, intermediate_size=inter, mlp_layers=(), norm_eps=cfg.get("norm_eps", 1e-6),
                   tie_word_embeddings=False,
                   final_softcap=cfg.get("output_logit_soft_cap", 30.0), final_softcap_fp32=True)
    return XlstmSpec(**{f.name: getattr(base, f.name) for f in fields(base)}, mlstm=mlstm)


class XlstmDecoder(TransformerDecoder):
    """The shared decoder whose every layer's mixer is an MlstmMixer (its tensors under `mlstm_layer.`)."""

    def load_mixer(self, i: int, prefix: str, weight, read):
        return MlstmMixer(self.config.mlstm, prefix + "mlstm_layer.", self.config.hidden_size, weight, self.tp)


MODEL = XlstmDecoder
