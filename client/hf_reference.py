"""Hugging Face models with random weights and Hugging Face's greedy generation: the reference
that the decoder benchmarks, the baseline `hf_generator` model and the tests hold ours against.

* ``random_gpt2`` / ``random_llama_1b`` (``llama_1b_config``): randomly initialised models of the
  two benchmark shapes (no weights can be downloaded on the GPU machine), greedy, EOS off;
* ``tiny_hf``: a published decoder shape (client/model_shapes.py) shrunk for the CPU tests;
* ``left_pad`` / ``generate_greedy``: prompts as one left-padded batch, and exactly ``n`` greedy
  tokens of HF ``generate`` for each (EOS ignored).
"""
from __future__ import annotations

__all__ = [
    "random_gpt2",
    "llama_1b_config",
    "random_llama_1b",
    "tiny_hf",
    "left_pad",
    "generate_greedy",
]


def _finish_model(model, device, dtype):
    model = model.to(device=device, dtype=dtype).eval()
    # Greedy, no EOS: every request runs exactly its budget in every system.
    gc = model.generation_config
    gc.do_sample = False
    gc.eos_token_id = None
    gc.pad_token_id = 0
    return model


def random_gpt2(device="cpu", dtype=None, config=None):
    """GPT2LMHeadModel with random weights; ``GPT2Config()`` defaults are gpt2 (124M).
    ``config`` (optional) replaces the default, for tiny smoke tests."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = config if config is not None else GPT2Config()
    cfg._attn_implementation = getattr(cfg, "_attn_implementation", None) or "sdpa"
    model = GPT2LMHeadModel(cfg)
    return _finish_model(model, device, dtype or torch.float32)


def llama_1b_config():
    """Llama-3.2-1B-shaped config (no rope_scaling; 8192 positions to keep rope tables small)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        # 5.x keeps rope settings in rope_parameters (rope_theta= alone is not read by every 5.x).
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=128000,
        eos_token_id=128001,
        attention_bias=False,
        mlp_bias=False,
    )


def random_llama_1b(device="cpu", dtype=None, config=None):
    """LlamaForCausalLM with random weights and the Llama-3.2-1B shape (``config`` overrides)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = config if config is not None else llama_1b_config()
    cfg._attn_implementation = getattr(cfg, "_attn_implementation", None) or "sdpa"
    model = LlamaForCausalLM(cfg)
    return _finish_model(model, device, dtype or torch.float32)


def tiny_hf(shape: str = "llama-3.1-8b", **changes):
    """A Hugging Face model from a published config shrunk for the CPU (client/model_shapes.py),
    random weights (norms perturbed so that they matter), fp32, 64 positions unless changed."""
    import torch
    import transformers

    from tritonformer.client.model_shapes import shrunk

    cfg = {**shrunk(shape), "max_position_embeddings": 64, **changes}
    model_type = cfg.pop("model_type")
    names = {"llama": "Llama", "gemma3_text": "Gemma3"}[model_type]
    config_class = "Gemma3TextConfig" if model_type == "gemma3_text" else f"{names}Config"
    hf_cfg = getattr(transformers, config_class)(**cfg)
    torch.manual_seed(7)
    hf = getattr(transformers, f"{names}ForCausalLM")._from_config(hf_cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def _gen_config(new_tokens: int):
    """Greedy, exactly ``new_tokens`` tokens: EOS disabled (None) and min_new_tokens = max_new_tokens."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )


def left_pad(prompts: list[list[int]], device):
    """Prompts as one left-padded batch (ids, attention mask), the way HF `generate` wants them."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def generate_greedy(model, ids, mask, new_tokens: int):
    """Exactly `new_tokens` greedy tokens for every row (EOS ignored); returns prompt + output ids."""
    import torch

    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen_config(new_tokens))
    return out
