"""Hunyuan MoE (`hunyuan_v1_moe`: Tencent's Hunyuan-A13B): Hunyuan dense's attention (per-head q / k
RMSNorms after the rotary, its NTK-alpha rope: hunyuan.py) with a mixture of experts in every
layer. The router's linear runs in fp32 (`mlp.gate.wg`); a softmax over the experts, the top
`moe_topk` renormalised and kept in fp32; a shared MLP (`mlp.shared_mlp`) added without a gate.
The experts and the shared MLP have `intermediate_size` columns each, as transformers builds
them. Per-layer lists of `num_experts` / `moe_topk` load where every layer has the same value."""
from tritonformer.backend.models import hunyuan
from tritonformer.backend.models.moe import MoeNames, MoeSpec
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder

NAMES = MoeNames(routers=("gate.wg",), shared="mlp.shared_mlp", shared_gate=None)


def _every_layer(cfg: dict, key: str) -> int:
    """The config's `key`, one int, or a list with the same value for every layer."""
    value = cfg[key]
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"Hunyuan MoE with per-layer {key} {sorted(set(value))} is not supported "
                             f"(supported: {key} the same for every layer)")
        value = value[0]
    return int(value)


def from_hf(cfg: dict) -> DecoderSpec:
    inter = cfg["intermediate_size"]
    moe = MoeSpec(num_experts=_every_layer(cfg, "num_experts"), top_k=_every_layer(cfg, "moe_topk"),
                  intermediate_size=inter, normalize=True, round_weights=False,
                  layers=(True,) * cfg["num_hidden_layers"], shared_intermediate_size=inter, names=NAMES,
                  router_fp32=True)
    return hunyuan.from_hf(cfg, moe=moe)


MODEL = TransformerDecoder
