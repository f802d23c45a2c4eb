"""GPT-1 (`openai-gpt`: OpenAI's original GPT, openai-community/openai-gpt): GPT-2's tensors (`Conv1D` projections,
a fused QKV `attn.c_attn`, learnt absolute positions `positions_embed`, biases on every linear, a head tied to the
token embeddings `tokens_embed`) in BERT's post-LN block: x = LN_1(x + attn(x)), x = LN_2(x + mlp(x)), each norm's
output the next residual stream (DecoderSpec's post_ln), no norm before attention or the MLP and none at the end.
The MLP is 4 x hidden wide, whatever else the config says. `afn` "gelu" is GPT-2's tanh approximation (transformers
maps it to gelu_new), "relu" ReLU; silu / swish (no plain SiLU MLP here) are refused.

Conv1D stores a projection as `[in, out]` (x @ W); the decoder reads nn.Linear's `[out, in]`: each is transposed as
it is read (a lazily read checkpoint's too, only the part a tensor-parallel rank takes). Config names: GPT-2's
`n_embd`, `n_layer`, `n_head`, `n_positions`."""
import torch

from tritonformer.backend.models.transformer import (GPT2_CONFIG_NAMES, DecoderSpec, TransformerDecoder, WeightNames,
                                                     config_renamed, layers_renamed, spec_from_hf)

NAMES = WeightNames(qkv="attn.c_attn", o="attn.c_proj", up="mlp.c_fc", down="mlp.c_proj", attn_post_norm="ln_1",
                    mlp_post_norm="ln_2", embed="tokens_embed.weight", positions="positions_embed.weight")
_CONV1D = tuple(f"{name}.weight" for name in (NAMES.qkv, NAMES.o, NAMES.up, NAMES.down))
_AFN = {"gelu": "gelu_tanh", "relu": "relu"}  # (transformers' ACT_FNS for GPT-1: its "gelu" is gelu_new)


class _Linear:
    """A lazily read Conv1D weight `[in, out]` seen as the `[out, in]` Linear the decoder reads: a read of all of
    it, or of a part (rows, columns), reads the stored tensor's matching part and transposes it."""

    def __init__(self, stored):
        self.stored = stored
        rows, cols = stored.shape
        self.shape, self.dtype = (cols, rows), getattr(stored, "dtype", None)

    def __getitem__(self, index) -> torch.Tensor:
        rows, cols = ((index if isinstance(index, tuple) else (index,)) + (slice(None),) * 2)[:2]
        return self.stored[cols, rows].t()

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.stored.to(*args, **kwargs).t()


def adapt(cfg: dict, state: dict) -> tuple[dict, dict]:
    """The published layers `h.{i}.` as `layers.{i}.`, each Conv1D weight among them as a Linear's (transposed);
    tensors already named as the decoder reads them (`layers.{i}.`, random_decoder's) are Linear's as they are."""
    def linear(name: str, t):
        if not (name.startswith("h.") and name.endswith(_CONV1D)):
            return t
        return t.t() if isinstance(t, torch.Tensor) else _Linear(t)

    return cfg, layers_renamed({name: linear(name, t) for name, t in state.items()}, "h.")


def from_hf(cfg: dict) -> DecoderSpec:
    cfg = {"max_position_embeddings": 512, **config_renamed(cfg, GPT2_CONFIG_NAMES)}
    afn = cfg.get("afn", "gelu")
    if afn not in _AFN:
        raise ValueError(f"GPT-1 with afn {afn!r} is not supported (supported: afn {', '.join(_AFN)})")
    hidden, heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    return spec_from_hf({**cfg, "intermediate_size": 4 * hidden}, tie_default=True,
                        norm_eps=cfg.get("layer_norm_epsilon", 1e-5), layer_norm=True, norm_bias=True, post_ln=True,
                        gated_mlp=False, activation=_AFN[afn], mlp_bias=True, qkv_bias=True, o_bias=True,
                        learned_positions=True, num_kv_heads=heads, rope_layers=(False,) * layers, names=NAMES)


MODEL = TransformerDecoder
