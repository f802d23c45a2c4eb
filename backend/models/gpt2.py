"""GPT-2 family decoder over a paged KV cache.

The same iteration shape as the Llama model (selective batching over packed tokens, paged
attention); what differs is the block: learned absolute positions, pre-LayerNorm with biases,
a fused QKV projection with bias and no rotary embedding, a GELU (tanh) MLP, and the output
head tied to the token embedding. Hugging Face stores GPT-2's projections as `Conv1D`
(`[in, out]`); they are transposed once at load into nn.Linear's `[out, in]`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonformer import kernels
from tritonformer.backend.decoder.batch import DecoderBatch
from tritonformer.backend.decoder.kv_cache import PagedKVCache
from tritonformer.backend.models.decoder import DecoderModel, eos_ids

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    max_position_embeddings: int
    gelu_approximate: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, cfg: dict) -> "GPT2Config":
        if cfg.get("model_type") not in ("gpt2", "gpt-sw3"):  # (GPT-SW3's: GPT-2's model in transformers)
            raise ValueError(f"expected model_type 'gpt2' or 'gpt-sw3', got {cfg.get('model_type')!r}")
        if cfg.get("tie_word_embeddings", True) is False:  # (the head here is the token embedding)
            raise ValueError("GPT-2 with tie_word_embeddings false is not supported (supported: tie_word_embeddings "
                             "true)")
        act = cfg.get("activation_function", "gelu_new")
        if act not in _GELU:
            raise ValueError(f"unsupported GPT-2 activation_function {act!r} (supported: {sorted(_GELU)})")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(flag):
                raise ValueError(f"GPT-2 option {flag} is not supported")
        if cfg.get("scale_attn_weights", True) is False:
            raise ValueError("GPT-2 without scale_attn_weights is not supported")
        hidden = cfg["n_embd"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg.get("n_inner") or 4 * hidden,
            num_layers=cfg["n_layer"],
            num_heads=cfg["n_head"],
            layer_norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
            max_position_embeddings=cfg.get("n_positions", 1024),
            gelu_approximate=_GELU[act],
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids(cfg),
        )


class GPT2Model(DecoderModel):
    def __init__(self, config: GPT2Config, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        super().__init__(config, state, device, dtype)
        w = self.weight

        def linear(name: str) -> torch.Tensor:  # Conv1D [in, out] -> Linear [out, in]
            return w(name).t().contiguous()

        self.wte = w("wte.weight")
        self.set_output_head(self.wte)  # tied
        self.wpe = w("wpe.weight")
        self.ln_f = (w("ln_f.weight"), w("ln_f.bias"))
        self.activation = kernels.gelu_activation(config.gelu_approximate)
        self.layers = []
        for i in range(config.num_layers):
            p = f"h.{i}."
            self.layers.append(
                {
                    "ln_1": (w(p + "ln_1.weight"), w(p + "ln_1.bias")),
                    "qkv_w": linear(p + "attn.c_attn.weight"),
                    "qkv_b": w(p + "attn.c_attn.bias"),
                    "o_w": linear(p + "attn.c_proj.weight"),
                    "o_b": w(p + "attn.c_proj.bias"),
                    "ln_2": (w(p + "ln_2.weight"), w(p + "ln_2.bias")),
                    "fc_w": linear(p + "mlp.c_fc.weight"),
                    "fc_b": w(p + "mlp.c_fc.bias"),
                    "proj_w": linear(p + "mlp.c_proj.weight"),
                    "proj_b": w(p + "mlp.c_proj.bias"),
                }
            )

    def _add_norm(self, x, bias, residual, ln) -> tuple[torch.Tensor, torch.Tensor]:
        """(LayerNorm(x + bias + residual), x + bias + residual) in one kernel: the residual add
        of one sub-block fused with the pre-norm of the next."""
        h = torch.empty_like(x)
        normed = kernels.add_bias_residual_layer_norm(x, bias, residual, ln[0], ln[1], self.config.layer_norm_eps,
                                                      sum_out=h)
        return normed, h

    @torch.inference_mode()
    def forward(self, batch: DecoderBatch, cache: PagedKVCache, fp32_logits: bool = True) -> torch.Tensor:
        """One iteration. The residual add and LayerNorm before each QKV projection and each
        MLP are that linear's PreNorm: for a decode row or two one kernel with the GEMM (and for
        the QKV projection the split and the cache write: kernels.prenorm_qkv_to_cache, and
        kernels.linear_act); for more rows a kernel of their own."""
        cfg = self.config
        ln = self.layers[0]["ln_1"]
        h = torch.empty((batch.input_ids.shape[0], cfg.hidden_size), dtype=self.dtype, device=self.device)
        x = kernels.embedding_layer_norm(batch.input_ids, self.wte, batch.positions, self.wpe, None, ln[0], ln[1],
                                         cfg.layer_norm_eps, sum_out=h)
        pre = None  # the first layer's input comes normalised from the embedding kernel
        for li, layer in enumerate(self.layers):
            q = kernels.prenorm_qkv_to_cache(
                x, pre, layer["qkv_w"], layer["qkv_b"], cfg.num_heads, cfg.num_heads, cfg.head_dim,
                None, None, cache.keys(li), cache.values(li), batch.slot_mapping,
            )
            if pre is not None:
                h = pre.sum_out
            ctx = batch.attention(q, cache.keys(li), cache.values(li))
            o = kernels.linear_act(ctx.reshape(ctx.shape[0], -1), layer["o_w"])
            ln = layer["ln_2"]
            mlp_pre = kernels.PreNorm(ln[0], ln[1], cfg.layer_norm_eps, layer["o_b"], h, torch.empty_like(h))
            up = kernels.linear_act(o, layer["fc_w"], layer["fc_b"], self.activation, prenorm=mlp_pre)
            h = mlp_pre.sum_out
            x = kernels.linear_act(up, layer["proj_w"])
            if li + 1 < len(self.layers):
                ln = self.layers[li + 1]["ln_1"]
                pre = kernels.PreNorm(ln[0], ln[1], cfg.layer_norm_eps, layer["proj_b"], h, torch.empty_like(h))
        if not batch.logits_every_row:
            x, h = x[batch.logits_index], h[batch.logits_index]
        x, _ = self._add_norm(x, self.layers[-1]["proj_b"], h, self.ln_f)
        return self.logits(x, fp32_logits)


from_hf = GPT2Config.from_hf
MODEL = GPT2Model
