"""BitNet b1.58's quantised forms against transformers' own: the packed ternary layout against pack_weights /
unpack_weights, and whole models whose linears are transformers' BitLinear / AutoBitLinear (its
replace_with_bitnet_linear, as its quantizer builds them), greedy token for token, in fp32 on the CPU. torch.compile
is turned off for transformers' functions (their eager form: in fp32 the same arithmetic) to keep the test fast."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
import transformers.integrations.bitnet as hf_bitnet  # noqa: E402

from tritonformer.backend.checkpoints.weights import strip_prefixes_of  # noqa: E402
from tritonformer.backend.models import bitnet  # noqa: E402
from tritonformer.backend.models.decoder import load_decoder  # noqa: E402
from tritonformer.client.model_shapes import shrunk  # noqa: E402

from decoder_steps import PagedSteps  # noqa: E402  (tests/ helper)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _eager():
    with torch.compiler.set_stance("force_eager"):
        yield


def test_unpack_matches_transformers_packing():
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-1, 2, (24, 10), generator=g).float()
    packed = hf_bitnet.pack_weights(w.clone())
    assert packed.dtype == torch.uint8 and packed.shape == (6, 10)
    ours = bitnet.unpack_ternary(packed, torch.bfloat16)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours.float(), w)
    assert torch.equal(ours, hf_bitnet.unpack_weights(packed, torch.bfloat16))


FORMS = [("bitlinear", "offline"), ("autobitlinear", "offline"), ("autobitlinear", "online")]


@pytest.mark.parametrize("linear_class,mode", FORMS, ids=["-".join(f) for f in FORMS])
def test_linear_matches_transformers(linear_class, mode):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 32, generator=g) * 3
    x[2] = 0.0  # (a zero row: the 1e-5 clamp)
    w = torch.randint(-1, 2, (16, 32), generator=g).float()
    if linear_class == "bitlinear":
        hf = hf_bitnet.BitLinear(32, 16, bias=False, dtype=torch.float32)
        hf.weight.copy_(hf_bitnet.pack_weights(w.clone()))
    else:
        hf = hf_bitnet.AutoBitLinear(32, 16, bias=False, dtype=torch.float32, online_quant=mode == "online")
        with torch.no_grad():
            hf.weight.copy_(w if mode == "offline" else torch.randn(16, 32, generator=g))
    if mode == "offline":
        hf.weight_scale.fill_(0.37)
    with torch.no_grad():
        want = hf(x)
        quant = "online" if mode == "online" else linear_class
        weight = (bitnet.quantize_online(hf.weight, torch.float32) if mode == "online"
                  else bitnet.unpack_ternary(hf.weight, torch.float32) if linear_class == "bitlinear" else hf.weight)
        scale = None if mode == "online" else hf.weight_scale.expand(16)
        got = bitnet.bit_linear(x, weight, scale, quant)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _hf_packed(linear_class: str, mode: str, cfg: dict | None = None, device=CPU, dtype=torch.float32):
    cfg = dict(cfg or shrunk("bitnet-b1.58-2b-4t"))
    cfg.pop("model_type")
    q = {"quant_method": "bitnet", "linear_class": linear_class, "quantization_mode": mode}
    hf_cfg = transformers.BitNetConfig(**cfg)
    torch.manual_seed(0)
    hf = transformers.BitNetForCausalLM._from_config(hf_cfg, attn_implementation="eager").eval().to(device, dtype)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    dense = {name: m.weight.detach().clone() for name, m in hf.named_modules()
             if isinstance(m, torch.nn.Linear) and name != "lm_head"}
    hf_bitnet.replace_with_bitnet_linear(hf, ["lm_head"], transformers.BitNetQuantConfig(**q))
    state = {}
    for i, (name, w) in enumerate(sorted(dense.items())):
        m = hf.get_submodule(name)
        m.to_empty(device=device)
        tern = torch.randint(-1, 2, w.shape, device=device).to(dtype)
        with torch.no_grad():
            if mode == "online":
                m.weight.copy_(w)
            else:
                m.weight.copy_(hf_bitnet.pack_weights(tern.clone()) if linear_class == "bitlinear" else tern)
                wide = 30.0 + i if linear_class == "bitlinear" else 1 / (30.0 + i)  # (outputs near 1 at K = 2560)
                m.weight_scale.fill_(0.5 + 0.05 * i if hf_cfg.hidden_size < 1024 else wide)
        state[name + ".weight"] = m.weight.detach().clone()
        if mode == "offline":
            state[name + ".weight_scale"] = m.weight_scale.detach().clone()
            if linear_class == "autobitlinear":  # (the checkpoint holds them packed, as the bitlinear ones)
                state[name + ".weight"] = hf_bitnet.pack_weights(tern.clone())
    for name, t in hf.state_dict().items():
        state.setdefault(name, t)
    config = {**hf_cfg.to_dict(), "quantization_config": q}
    return hf, load_decoder(config, strip_prefixes_of(state), device, dtype)


@pytest.mark.parametrize("linear_class,mode", FORMS, ids=["-".join(f) for f in FORMS])
def test_packed_checkpoint_greedy_is_token_identical_to_hf(linear_class, mode):
    hf, ours = _hf_packed(linear_class, mode)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (5, 29)]
    got = PagedSteps(ours, num_blocks=96, block_size=8).greedy(prompts, 16)
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert tokens == out[0, len(prompt):].tolist()
        assert len(set(tokens)) > 1  # (not a degenerate repeat)


@pytest.mark.parametrize("changes,named", [
    ({"hidden_act": "silu"}, "hidden_act"),
    ({"quantization_config": {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "online"}},
     "quantization_config"),
    ({"quantization_config": {"quant_method": "bitnet", "use_rms_norm": True}}, "use_rms_norm"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_unsupported_options_are_refused_by_name(changes, named):
    with pytest.raises(ValueError, match=named):
        bitnet.from_hf({**shrunk("bitnet-b1.58-2b-4t"), **changes})


def test_tensor_parallel_and_fp8_are_refused_by_name():
    from tritonformer.backend.models.decoder import check_tensor_parallel

    cfg = shrunk("bitnet-b1.58-2b-4t")
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'bitnet'"):
        check_tensor_parallel(cfg, 2)
    with pytest.raises(ValueError, match="FP8 linears are not supported for model_type 'bitnet'"):
        load_decoder(cfg, {}, CPU, torch.float32, quantization="fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("linear_class,mode", FORMS, ids=["-".join(f) for f in FORMS])
def test_packed_forms_at_the_published_width_match_hf_on_gpu(linear_class, mode):
    """The packed forms at the published width (2 layers), in bf16 on the GPU, both sides' own arithmetic
    (transformers' compiled quantisation here: the fixture's force_eager lifted): the last position's logits of a
    prompt as close as cosine 0.999 (16-bit GEMMs accumulate in different orders)."""
    from tritonformer.client.model_shapes import DECODER_SHAPES

    with torch.compiler.set_stance("default"):
        cuda = torch.device("cuda")
        cfg = {**DECODER_SHAPES["bitnet-b1.58-2b-4t"], "num_hidden_layers": 2}
        hf, ours = _hf_packed(linear_class, mode, cfg, cuda, torch.bfloat16)
        prompt = torch.randint(3, 128000, (1, 40), generator=torch.Generator().manual_seed(2)).tolist()[0]
        logits = PagedSteps(ours, num_blocks=16, block_size=16).step([(0, prompt)])[-1].float()
        with torch.no_grad():
            want = hf(torch.tensor([prompt], device=cuda)).logits[0, -1].float()
        assert torch.nn.functional.cosine_similarity(logits, want, dim=0) > 0.999
