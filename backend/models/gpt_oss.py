"""gpt-oss (OpenAI's gpt-oss-20b and gpt-oss-120b, `gpt_oss`): Llama's block with biases on Q, K,
V and the output projection, a learnt "sink" logit per layer and query head in the attention's
softmax (its share of the probability is dropped: a head may attend to nothing), sliding-window
(128 tokens) and full layers alternating, YaRN, and a mixture-of-experts MLP in every layer.

The router is a linear with a bias; each token takes its k largest logits and a softmax over
those k (the softmax over all experts renormalised over the k), rounded to the activation dtype.
Each expert has biases on its gate/up and down projections and a clamped SwiGLU:
g = min(gate, 7), u = clamp(up, -7, 7), g * sigmoid(1.702 g) * (u + 1) (kernels' `swiglu_oai`).
Checkpoints stack the experts as x @ W, `experts.gate_up_proj` `[E, H, 2I]` with the gate and
up columns interleaved and `experts.down_proj` `[E, I, H]`, each with a `_bias`; the published
ones store both in MXFP4, dequantised to 16 bits at load (backend/checkpoints/mxfp4.py)."""
from tritonformer.backend.models.moe import MoeNames, MoeSpec, num_experts
from tritonformer.backend.models.transformer import DecoderSpec, TransformerDecoder, layer_windows, spec_from_hf
from tritonformer.kernels import reference

NAMES = MoeNames(routers=("router",), stacked=(("experts.gate_up_proj", "experts.down_proj"),), columns=True)
# The rope of a config that names none (transformers' GptOssConfig's).
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
# What the kernels' swiglu_oai computes: the only values supported.
SWIGLU = {"swiglu_alpha": reference.SWIGLU_OAI_ALPHA, "swiglu_limit": reference.SWIGLU_OAI_LIMIT}


def from_hf(cfg: dict) -> DecoderSpec:
    for key, value in SWIGLU.items():
        if cfg.get(key, value) != value:
            raise ValueError(f"{key} {cfg[key]} is not supported (supported: {key} {value}, gpt-oss's)")
    if not (cfg.get("rope_scaling") or cfg.get("rope_parameters")):
        cfg = {**cfg, "rope_scaling": DEFAULT_ROPE}
    layers = cfg["num_hidden_layers"]
    top_k = cfg.get("num_experts_per_tok", cfg.get("experts_per_token", 4))
    moe = MoeSpec(num_experts=num_experts(cfg), top_k=top_k, intermediate_size=cfg["intermediate_size"],
                  normalize=True, round_weights=True, layers=(True,) * layers, names=NAMES, router_bias=True,
                  expert_bias=True)
    # transformers' rule where the config lists no layer types: sliding, full, sliding, ...
    sliding = [(i + 1) % 2 == 1 for i in range(layers)]
    bias = bool(cfg.get("attention_bias", True))
    return spec_from_hf(cfg, default_theta=150000.0, norm_eps=cfg.get("rms_norm_eps", 1e-5), qkv_bias=bias,
                        o_bias=bias, sinks=True, activation="swiglu_oai", moe=moe,
                        layer_windows=layer_windows(cfg, cfg.get("sliding_window", 128), sliding))


MODEL = TransformerDecoder
