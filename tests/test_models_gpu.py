"""Our models on the GPU (Triton kernels, fp16) against Hugging Face transformers on the same
weights. Run on the GPU machine: `pytest -m gpu`."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

from tritonformer.backend.models.bert import BertConfig, BertEncoder
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.backend.checkpoints.weights import load_config, load_state_dict, strip_prefixes_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
from decoder_steps import PagedSteps  # noqa: E402  (tests/ helper)

transformers = pytest.importorskip("transformers")
CUDA = torch.device("cuda")


def _cos_min(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).min().item()


def _packed(lengths, vocab, gen):
    seqs = [torch.randint(1000, vocab - 1, (n,), generator=gen).tolist() for n in lengths]
    ids = torch.tensor([t for s in seqs for t in s], device=CUDA)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=CUDA)
    return seqs, ids, cu


def _check_encoder(hf, ours, lengths, vocab, cos=0.999):
    gen = torch.Generator().manual_seed(5)
    seqs, ids, cu = _packed(lengths, vocab, gen)
    hidden = ours.forward(ids, cu, max(lengths))
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            ref = hf(input_ids=torch.tensor([s], device=CUDA)).last_hidden_state[0]
            assert _cos_min(hidden[cu[i] : cu[i + 1]], ref) >= cos, (i, len(s))


@pytest.mark.parametrize("fused_gemm_rows", [0, 1024])
def test_random_bert_base_fp16_matches_hf_sdpa(monkeypatch, fused_gemm_rows):
    """Both FFN up-projection paths for a batch this size (1,212 tokens): cuBLAS + the bias_gelu
    kernel, and the fused many-row Triton GEMM (which the default reaches from 4,096 rows)."""
    from tritonformer.kernels import triton_small_gemm

    monkeypatch.setattr(triton_small_gemm, "LARGE_ROWS", fused_gemm_rows)
    cfg = transformers.BertConfig()
    torch.manual_seed(0)
    hf = transformers.BertModel._from_config(cfg, attn_implementation="sdpa", add_pooling_layer=False)
    hf = hf.eval().to(CUDA, torch.float16)
    ours = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf.state_dict(), CUDA, torch.float16)
    _check_encoder(hf, ours, [1, 7, 128, 300, 512, 64, 200], cfg.vocab_size)


def _minilm_dir() -> Path:
    env = os.environ.get("TRITONFORMER_MINILM_DIR")
    if env:
        return Path(env)
    try:
        from tritonformer.backend.checkpoints import minilm_dir

        return minilm_dir()
    except (FileNotFoundError, ImportError):
        pytest.skip("the all-MiniLM-L6-v2 checkpoint is not installed here")


def test_real_minilm_fp16_matches_hf():
    folder = _minilm_dir()
    hf = transformers.AutoModel.from_pretrained(folder, torch_dtype=torch.float16).eval().to(CUDA)
    ours = BertEncoder(BertConfig.from_hf(load_config(folder)), load_state_dict(folder), CUDA, torch.float16)
    _check_encoder(hf, ours, [3, 40, 256, 512, 17], 30522)


def test_triton_and_reference_paths_agree(monkeypatch):
    cfg = transformers.BertConfig(num_hidden_layers=2)
    torch.manual_seed(1)
    hf = transformers.BertModel._from_config(cfg, add_pooling_layer=False).eval()
    ours = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf.state_dict(), CUDA, torch.float16)
    gen = torch.Generator().manual_seed(2)
    _, ids, cu = _packed([5, 77, 200], cfg.vocab_size, gen)
    fast = ours.forward(ids, cu, 200)
    monkeypatch.setenv("TRITONFORMER_KERNELS", "reference")
    slow = ours.forward(ids, cu, 200)
    assert _cos_min(fast, slow) >= 0.9995


def _check_decoder_steps(hf, ours, prompts, steps=8):
    """Prompts prefilled together (the first in two chunks), then decode steps of all of them
    together; every step's logits against HF on the whole sequence so far."""
    run = PagedSteps(ours, num_blocks=512, block_size=16)
    histories = [list(p) for p in prompts]
    logits = run.step([(0, prompts[0][:100])] + [(i, p) for i, p in enumerate(prompts) if i])
    logits = torch.cat([run.step([(0, prompts[0][100:])]), logits[1:]])
    for step in range(steps):
        with torch.inference_mode():
            for i, h in enumerate(histories):
                ref = hf(torch.tensor([h], device=CUDA)).logits[0, -1]
                assert _cos_min(logits[i : i + 1], ref[None]) >= 0.999, (step, i)
        nxt = logits.argmax(-1).tolist()
        for h, t in zip(histories, nxt):
            h.append(t)
        logits = run.step([(i, [t]) for i, t in enumerate(nxt)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_llama_iterations_match_hf_on_gpu(dtype):
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False,
    )
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(cfg).eval().to(CUDA, dtype)
    ours = load_decoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CUDA, dtype)
    gen = torch.Generator().manual_seed(4)
    _check_decoder_steps(hf, ours, [torch.randint(0, 32000, (n,), generator=gen).tolist() for n in (300, 1, 57)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpt2_iterations_match_hf_on_gpu(dtype):
    cfg = transformers.GPT2Config()
    torch.manual_seed(5)
    hf = transformers.GPT2LMHeadModel(cfg).eval().to(CUDA, dtype)
    ours = load_decoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CUDA, dtype)
    gen = torch.Generator().manual_seed(6)
    _check_decoder_steps(hf, ours, [torch.randint(0, 50256, (n,), generator=gen).tolist() for n in (700, 3, 129)])


def _prefilled_decode_rows(model, cache, low: int, high: int) -> list:
    """Five sequences (700, 3, 129, 40 and 1,000 tokens, ids in [low, high)) prefilled into `cache`, their blocks
    laid out in turn; their next decode rows (BatchEntry each)."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch

    gen = torch.Generator().manual_seed(8)
    lengths = [700, 3, 129, 40, 1000]
    tables, next_block = [], 0
    for n in lengths:
        nb = -(-(n + 1) // 16)
        tables.append(list(range(next_block, next_block + nb)))
        next_block += nb
    prompts = [torch.randint(low, high, (n,), generator=gen).tolist() for n in lengths]
    model.forward(build_batch([BatchEntry(p, 0, t, True) for p, t in zip(prompts, tables)], 16, CUDA), cache)
    return [BatchEntry([7 + i], n, t, True) for i, (n, t) in enumerate(zip(lengths, tables))]


def test_decode_graph_replay_equals_eager():
    """Captured decode iterations (padded to a bucket, fixed key splits) give the eager logits."""
    from tritonformer.backend.decoder.graphs import DecodeGraphs
    from tritonformer.backend.decoder.batch import build_batch

    cfg = transformers.GPT2Config(n_layer=2)
    torch.manual_seed(7)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ours = load_decoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CUDA, torch.float16)
    cache = ours.new_kv_cache(256, 16)
    # Every fed token here is a real id, so the previous samples (last_ids) are never read.
    graphs = DecodeGraphs(ours, cache, 16, 64, torch.zeros(16, dtype=torch.long, device=CUDA))
    graphs.warm_up()
    entries = _prefilled_decode_rows(ours, cache, 0, 50256)
    logits, greedy_ids = graphs.run(entries)
    replayed, n = logits[: len(entries)].float(), len(entries)  # (the graph keeps fp16 logits)
    assert greedy_ids.tolist()[:n] == replayed.argmax(-1).tolist()  # the replay's own argmax
    assert graphs.last_ids[:n].tolist() == greedy_ids.tolist()[:n]  # left where feed_tokens reads
    eager = ours.forward(build_batch(entries, 16, CUDA), cache)
    assert graphs.replays == 1 and graphs.bucket(len(entries)) == 8 and logits.shape[0] == 8
    torch.testing.assert_close(replayed, eager, atol=2e-2, rtol=2e-2)
    assert _cos_min(replayed, eager) >= 0.9999


def test_alibi_decode_graph_replay_equals_eager():
    """ALiBi's slopes (a device tensor made at load) read by captured decode iterations: a shrunk
    BLOOM (6 heads of 64, its own slopes) replays the eager logits, 16 key splits included."""
    from tritonformer.backend.decoder.graphs import DecodeGraphs
    from tritonformer.backend.decoder.batch import build_batch
    from tritonformer.client.model_shapes import random_decoder, shrunk

    cfg = {**shrunk("bloom-560m", hidden=384, heads=6), "max_position_embeddings": 2048}
    ours = random_decoder(cfg, CUDA, torch.float16)
    assert ours.alibi_slopes.device.type == "cuda"
    cache = ours.new_kv_cache(256, 16)
    graphs = DecodeGraphs(ours, cache, 16, 64, torch.zeros(16, dtype=torch.long, device=CUDA))
    graphs.warm_up()
    entries = _prefilled_decode_rows(ours, cache, 3, 320)
    logits, _ = graphs.run(entries)
    replayed = logits[: len(entries)].float()
    eager = ours.forward(build_batch(entries, 16, CUDA), cache)
    torch.testing.assert_close(replayed, eager, atol=2e-2, rtol=2e-2)
    assert _cos_min(replayed, eager) >= 0.9999


def _replays_equal_eager(batches, seed):
    """A 2-layer random bert-base: each batch of lengths run eagerly and replayed from its
    CUDA-graph bucket agree; returns the graphs (for their replay and capture counts)."""
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    cfg = transformers.BertConfig(num_hidden_layers=2)
    torch.manual_seed(seed)
    hf = transformers.BertModel._from_config(cfg, add_pooling_layer=False).eval()
    ours = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf.state_dict(), CUDA, torch.float16)
    graphs = EncoderGraphs(ours)
    gen = torch.Generator().manual_seed(seed + 1)
    for lengths in batches:
        _, ids, cu = _packed(lengths, cfg.vocab_size, gen)
        eager = ours.forward(ids, cu, max(lengths))
        replayed = graphs.forward(ids, lengths)
        assert replayed.shape == eager.shape
        assert _cos_min(replayed, eager) >= 0.9999
    return graphs


def test_cuda_graph_replay_equals_eager():
    graphs = _replays_equal_eager(([32], [5, 9, 1], [100, 3, 60, 7], [32], [512], [7, 9, 1]), seed=6)  # repeats replay
    assert graphs.replays == 6 and len(graphs._graphs) == 5  # (32,2) (16,4) (256,8) (512,2) (32,4)


def test_cuda_graph_replay_of_the_fused_ffn_gemm_equals_eager():
    """A batch in the 8,192-token bucket runs the fused many-row FFN GEMM (TMA descriptors baked
    into the graph's kernel parameters): its replays, on new inputs each time, equal eager runs."""
    from tritonformer.kernels import triton_gemm

    if not triton_gemm.supported(CUDA):
        pytest.skip("the fused FFN GEMM needs TMA (Hopper or newer)")
    # 4,648 and 4,800 tokens: the 8,192-token bucket, with 16 and 32 sequence slots
    graphs = _replays_equal_eager(([512] * 9 + [40], [300] * 16, [512] * 9 + [40]), seed=8)
    assert graphs.replays == 3 and len(graphs._graphs) == 2


def test_generator_engine_tokens_are_hf_greedy_on_gpu():
    """The whole engine on the GPU (decode graphs, tokens fed back on the device while the host
    runs an iteration ahead, prompts joining mid-flight): every token it picked is HF's greedy
    choice given the same history, up to numeric near-ties (fp16 vs HF fp32)."""
    from tritonformer.backend.decoder.sampling_params import SamplingParams
    from tritonformer.client.engine_drive import our_engine

    cfg = transformers.GPT2Config(n_layer=4)
    torch.manual_seed(9)
    hf = transformers.GPT2LMHeadModel(cfg).eval().to(CUDA)
    engine, sink = our_engine(hf.half(), CUDA, torch.float16, max_running=8, token_budget=256, kv_fraction=0.05)
    hf.float()
    gen = torch.Generator().manual_seed(10)
    prompts = [torch.randint(0, 50256, (n,), generator=gen).tolist() for n in (5, 300, 33, 1, 90, 17)]
    seqs = [engine.new_sequence(i, p, SamplingParams(max_tokens=20, ignore_eos=True), False) for i, p in enumerate(prompts)]
    engine.admit(seqs[:3])
    for _ in range(4):
        engine.step()
    engine.admit(seqs[3:])  # join while the others decode
    while engine.has_work():
        engine.step()
    assert sink.finished == len(prompts) and not sink.errors
    assert engine.runner.graphs.replays > 0
    with torch.inference_mode():
        for seq, prompt in zip(seqs, prompts):
            assert len(seq.output_ids) == 20 and min(seq.output_ids) >= 0
            full = torch.tensor([prompt + seq.output_ids], device=CUDA)
            logits = hf(full).logits[0, len(prompt) - 1 : -1].float()
            chosen = logits.gather(1, torch.tensor(seq.output_ids, device=CUDA)[:, None]).squeeze(1)
            shortfall = logits.max(-1).values - chosen  # 0 where ours is HF's argmax
            assert shortfall.max().item() < 2e-2, shortfall.tolist()


def test_decode_rounds_on_graphs_give_the_tokens_of_single_iterations():
    """Rounds of several iterations per launch replay each decode graph again on inputs the
    graph moved on itself; between replays, sampled rows are drawn on the host's stream. Same
    requests, one iteration per launch vs four: the same tokens, greedy and seeded sampling
    alike (every sequence runs the same length, so both runs use the same graph buckets)."""
    from tritonformer.backend.decoder.sampling_params import SamplingParams
    from tritonformer.client.engine_drive import our_engine

    cfg = transformers.GPT2Config(n_layer=2)
    torch.manual_seed(12)
    hf = transformers.GPT2LMHeadModel(cfg).eval().to(CUDA).half()
    gen = torch.Generator().manual_seed(13)
    prompts = [torch.randint(0, 50256, (n,), generator=gen).tolist() for n in (7, 40, 3, 18, 25)]
    params = [SamplingParams(max_tokens=23, ignore_eos=True),
              SamplingParams(max_tokens=23, temperature=0.8, top_k=50, seed=1, ignore_eos=True),
              SamplingParams(max_tokens=23, temperature=1.0, top_p=0.9, seed=2, ignore_eos=True)]
    outputs = {}
    for steps in (1, 4):
        for mix in ("greedy", "mixed"):
            engine, sink = our_engine(hf, CUDA, torch.float16, max_running=8, token_budget=256, kv_fraction=0.05,
                                      max_decode_steps=steps)
            chosen = [params[0] if mix == "greedy" else params[i % 3] for i in range(len(prompts))]
            seqs = [engine.new_sequence(i, p, sp, False) for i, (p, sp) in enumerate(zip(prompts, chosen))]
            engine.admit(seqs)
            while engine.has_work():
                engine.step()
            assert sink.finished == len(prompts) and not sink.errors
            assert engine.runner.graphs.replays > 0 and engine.scheduler.blocks.num_used == 0
            outputs[steps, mix] = [s.output_ids for s in seqs]
            del engine
    for mix in ("greedy", "mixed"):
        assert outputs[4, mix] == outputs[1, mix]
    assert outputs[1, "mixed"] != outputs[1, "greedy"]  # the sampled rows did sample


FAMILY_SHAPES = ["llama-3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b", "gemma-2-9b", "gemma-3-1b", "phi-3-mini",
                 "phi-4-mini", "granite-3.1-8b", "smollm3-3b", "glm-4-9b",
                 "gemma-7b", "ministral-8b", "ernie-4.5-0.3b", "helium-1-2b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "mixtral-8x7b",
                 "granite-3.1-3b-a800m", "glm-4.5-air", "olmo-2-7b", "olmoe-1b-7b", "command-r7b", "phi-3.5-moe",
                 "mimo-v2-flash",
                 "gpt-oss-20b", "ernie-4.5-21b-a3b", "dots.llm1", "starcoder2-3b", "stablelm-2-1.6b",
                 "nemotron-mini-4b", "arcee-afm", "bitnet-b1.58-2b-4t", "jais2", "solar-open-100b", "phi-2", "pythia-6.9b",
                 "flex-olmo-7x7b", "falcon-7b", "falcon-40b", "bloom-560m", "bloom-7b1", "mpt-7b",
                 "starcoder-15b", "opt-125m", "gpt-j-6b", "cwm-32b",
                 "granite-swash-2b", "granitemoe-swa-3b", "olmo-7b", "nanochat-d32", "hyperclovax",
                 "mellum2-12b-a2.5b", "minimax-m2", "command-a-plus",
                 "codegen-350m-mono", "gpt-neo-125m", "hy3-preview", "biogpt", "flint", "trinity-mini",
                 "lfm2-1.2b", "lfm2-8b-a1b", "persimmon-8b", "deepseek-v3", "deepseek-v2-lite",
                 "glm-4.7-flash", "youtu-llm-2b", "mistral-small-4", "minicpm3-4b", "xglm-564m", "apertus-8b",
                 "deepseek-v3.2", "glm-5", "a.x-k1", "a.x-k2", "kolibri-1", "laguna-xs.2", "longcat-flash-chat",
                 "llama-4-scout",
                 "dbrx-132b", "qwen3-next-80b-a3b", "qwen3.5-27b", "qwen3.5-35b-a3b", "granite-4.0-h-tiny",
                 "bamba-9b", "nemotron-h-8b", "nemotron-3-nano-30b-a3b", "falcon-h1-0.5b", "olmo-hybrid-7b",
                 "lfm3-1.7b", "recurrentgemma-2b", "ettin-decoder-150m",
                 "zamba2-2.7b", "zamba-7b", "kimi-linear-48b-a3b", "ling-3.0-flash", "mamba-2.8b", "falcon-mamba-7b",
                 "mamba-codestral-7b", "jamba-mini", "gemma-3n-e2b", "minimax-text-01",
                 "gemma-4-31b", "gemma-4-26b-a4b", "gemma-4-e2b", "gemma-4-12b", "jetmoe-8b", "zaya1-8b",
                 "diffllama-0.3b", "llama-3.2-11b-vision", "phi-4-multimodal", "emu3-chat", "dots3-note-prev",
                 "hy4-preview", "openai-gpt", "ctrl", "gpt-neox-japanese-2.7b", "aria", "minimax-m3",
                 "beam-1.0-501b-a23b", "doge-320m", "hrm-text-1b", "inkling", "inkling2-small",
                 "deepseek-v4-flash", "rwkv-4-169m-pile", "xlstm-7b", "qwen4-exp"]
# Fewer layers where 8 in fp32 (HF's reference) and twice in bf16 do not fit 80 GB (GLM-4.5-Air:
# its dense first layer and one MoE layer), or for time (Falcon-40B: 0.6B weights a layer;
# CWM: 0.48B, four layers still reach a global one and three windowed ones; MiniMax-M2: 3.6B
# weights a layer, its 256 experts; Command A Plus: 4.7B, its 8 experts of 22,528 columns over 8,192; Hy3: its
# dense first layer and one of 3.6B, 192 experts; Trinity Mini: its two dense layers, two MoE ones of 0.8B, the
# fourth global; DeepSeek-V3: two of its three dense layers, its latent attention at its width: one MoE layer, 11B
# weights in 256 experts, would not fit beside them in fp32; Llama-4-Scout: 2.2B weights a layer, its 16 experts of
# 8,192 columns over 5,120, four layers reaching its first NoPE one; DBRX: 3.2B weights a layer in 16 experts),
# or more where the config lists each layer (GPT-Neo-125M's attention_types: all 12; LFM2-8B-A1B's layer_types: all
# 24, 8.3B weights; LFM2-1.2B lists its attending layers by index, so 8 of them keep two). Qwen3-Next-80B-A3B and
# Qwen3.5-35B-A3B: three DeltaNet layers and a full-attention one, 1.6B / 0.8B weights a layer in their experts.
# Granite-4.0-H-Tiny lists each layer's kind: all 40 (6.6B weights, four attending); Bamba-9B: 10 layers reach its
# first attending one (9). (Nemotron-H-8B's pattern names every block: all 52, 8B weights, whatever the count says.)
# Nemotron-3-Nano-30B-A3B: its pattern cut to its first eight blocks (LAYER_LISTS), three Mamba-2 blocks each before
# a MoE one (1.3B weights in 128 experts) or none, the first attending one and its MoE block, a Mamba-2 one.
# Zamba2-2.7B's layers_block_type names each layer (transformers builds what it lists): all 54, 2.7B weights.
# Gemma-3n-E2B lists each layer's type, MLP width and sparsity, its last 10 sharing keys: all 30 (4.4B weights with
# its per-layer embeddings).
# Kimi-Linear-48B-A3B: its first four layers (LAYER_LISTS: the published lists cut to them), three KDA layers and a
# latent-attention one, the dense first MLP and three MoE ones of 1.8B weights in 256 experts.
# Phi-3.5-MoE: two layers, 1.3B weights each in its 16 experts of 6,400 columns over 4,096 (as Mixtral's two).
# MiMo-V2-Flash: two layers, its dense full-attention first one and a windowed MoE one (6.4B weights in 256 experts).
# Jamba-Mini: its first five layers, Mamba-1 with a dense MLP (0, 2) and with 16 experts (1, 3: 2.8B weights each),
# the first attending one (4).
# MiniMax-Text-01: two layers (LAYER_LISTS: a lightning one, then softmax attention, where the published list's first
# softmax layer is the 8th), 5.4B weights each in its 32 experts of 9,216 columns over 6,144.
# Mistral-Small-4: two layers, 3.2B weights each in its 128 experts of 2,048 columns over 4,096 (fp32: 13 GB a layer).
# DeepSeek-V3.2: two of its three dense layers, as DeepSeek-V3 (its latent attention and indexers at its width, bf16);
# GLM-5: two layers, a dense one and a MoE one (LAYER_LISTS: first_k_dense_replace 1; 9.7B weights in 256 experts of
# 2,048 over 6,144, 39 GB in fp32, twice: HF's and ours, on the H200's 139 GB).
# Gemma-4-31B and 26B-A4B: six layers (LAYER_LISTS: five sliding ones and a full one, the published pattern's first
# six), 0.48B weights a layer (31B) / 0.76B in 128 experts (26B); Gemma-4-12B (unified) likewise, six of its assumed
# 48; Gemma-4-E2B: all 35, its last 20 sharing keys (2.3B weights in its per-layer embeddings). Zamba-7B: 14 of its
# 76 layers (for time), the shared block run at 2, 7 and 13.
LAYERS = {"gpt-neo-125m": 12, "lfm2-8b-a1b": 24, "mixtral-8x7b": 2, "glm-4.5-air": 2, "gpt-oss-20b": 4, "dots.llm1": 2,
          "solar-open-100b": 2, "flex-olmo-7x7b": 4, "falcon-40b": 4, "cwm-32b": 4, "minimax-m2": 2,
          "command-a-plus": 2, "hy3-preview": 2, "trinity-mini": 4, "deepseek-v3": 2, "llama-4-scout": 4,
          "dbrx-132b": 2, "qwen3-next-80b-a3b": 4, "qwen3.5-35b-a3b": 4, "granite-4.0-h-tiny": 40, "bamba-9b": 10,
          "zamba2-2.7b": 54, "zamba-7b": 14, "kimi-linear-48b-a3b": 4, "jamba-mini": 5, "nemotron-3-nano-30b-a3b": 8,
          "gemma-3n-e2b": 30, "phi-3.5-moe": 2, "minimax-text-01": 2,
          "mimo-v2-flash": 2, "mistral-small-4": 2, "deepseek-v3.2": 2, "glm-5": 2, "gemma-4-31b": 6,
          "gemma-4-26b-a4b": 6, "gemma-4-e2b": 35, "gemma-4-12b": 6,
          # A.X-K1: its dense first layer and one MoE layer (8.5B weights in 192 experts of 2,048 over 7,168: 34 GB in
          # fp32, twice), the layer whose norm after the experts is its one change to DeepSeek-V3
          "a.x-k1": 2,
          # A.X-K2: its dense first layer and three MoE ones (0.4B weights each in 128 experts of 512 over 2,048),
          # every one behind gated norms and a gated query projection (for time; the whole 48 fit)
          "a.x-k2": 4,
          # Kolibri-1: five layers, four windowed ones and the first global (NoPE) one, 1.5B weights a layer in 384
          # experts of 512 over 2,560 (fp32: 30 GB, twice)
          "kolibri-1": 5,
          # Laguna-XS.2: four layers (LAYER_LISTS: three sliding ones, then a full one, as assumed published), its dense
          # first layer and three MoE ones of 0.8B weights in 256 experts of 512 over 2,048
          "laguna-xs.2": 4,
          # Ling-3.0-Flash: its first six layers, five KDA ones then its first latent-attention one (the last of its
          # group of 6), its two dense MLPs and four MoE ones of 3.0B weights each in 512 experts of 768 over 2,560
          # (12 GB a layer in fp32, twice: HF's and ours, about 105 GB with the embeddings on the H200's 139 GB)
          "ling-3.0-flash": 6,
          # ZAYA1-8B: four of its 40 layers (for time), 0.4B weights each in its 16 experts of 2,048 over 2,048, the
          # router's hidden state carried through three of them
          "zaya1-8b": 4,
          # LongCat-Flash: one layer (num_hidden_layers counts its two sublayers), 26B weights in HF's model (512
          # experts of 2,048 over 6,144, [gate; up] stacked for the 256 identity experts too): ~110 GB in fp32 with
          # the embeddings, which ours reads in place (fp32: no copy), on the H200's 139 GB
          "longcat-flash-chat": 2,
          # Dots3: its first three layers, two indexed ones (served dense) and the first sliding one, whose latent
          # attention has a shape of its own; the dense first MLP, then two MoE ones of 6.0B weights in 256 experts
          "dots3-note-prev": 3,
          # HY-V4: three layers (its dense first MLP, then 1.7B weights a layer in 256 experts), indexers full, shared
          "hy4-preview": 3,
          # Aria: four layers of 0.85B weights, 64 experts of 1,664 over 2,560 and two shared ones
          "aria": 4,
          # MiniMax-M3: two layers (LAYER_LISTS: a sparse-attention layer with a dense MLP, then a full-attention one
          # with 7.2B weights in 128 experts of 3,072 over 6,144: 29 GB in fp32, twice)
          "minimax-m3": 2,
          # Beam: two layers (LAYER_LISTS: a sliding one with a dense MLP, then a full NoPE one with 10B weights in 256
          # experts of 2,560 over 5,120: 40 GB in fp32, twice)
          "beam-1.0-501b-a23b": 2,
          # Inkling: two layers (LAYER_LISTS: a sliding one with a dense MLP, a full one with 64 of its 256 experts:
          # 3.6B weights at their published 3,072 over 6,144; all 256 would be 58 GB a layer in fp32, twice)
          "inkling": 2,
          # Inkling 2: two layers (LAYER_LISTS: a sliding and a full one), 64 of its 384 experts of 2,304 over 4,608
          "inkling2-small": 2,
          # DeepSeek-V4: four layers (two heavily compressed, a compressed-sparse one, a heavily compressed one; the
          # first three hash-routed), 64 of its 256 experts of 2,048 over 4,096 (LAYER_LISTS): 1.6B weights a layer
          "deepseek-v4-flash": 4,
          # Qwen4-Exp: four layers (three gated DeltaNet ones, then one with the QSA indexer), 512 experts of 512 over
          # 2,048 in each: 1.6B weights a layer
          "qwen4-exp": 4}
# Configs that list each layer's kind by index past the cut (transformers' KimiLinearConfig fails on an index beyond
# num_hidden_layers): the lists of the layers kept, as published.
LAYER_LISTS = {"kimi-linear-48b-a3b": {"linear_attn_config": {
    "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4, "full_attn_layers": [4], "kda_layers": [1, 2, 3]}},
    "nemotron-3-nano-30b-a3b": {"hybrid_override_pattern": "MEMEM*EM"},
    "minimax-text-01": {"layer_types": ["linear_attention", "full_attention"]},
    "gemma-4-31b": {"layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
    "gemma-4-26b-a4b": {"layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
    "gemma-4-12b": {"layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
    "glm-5": {"first_k_dense_replace": 1},  # (not a list: its second layer a MoE one)
    "laguna-xs.2": {"layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
    "minimax-m3": {"layer_types": ["minimax_m3_sparse", "full_attention"], "mlp_layer_types": ["dense", "sparse"]},
    "beam-1.0-501b-a23b": {"layer_types": ["sliding_attention", "full_attention"],
                           "mlp_layer_types": ["dense", "sparse"]},
    "inkling": {"n_routed_experts": 64, "layer_types": ["hybrid_sliding", "hybrid"],
                "mlp_layer_types": ["dense", "sparse"]},
    "inkling2-small": {"n_routed_experts": 64, "layer_types": ["hybrid_sliding", "hybrid"]},
    "deepseek-v4-flash": {"n_routed_experts": 64},
    "xlstm-7b": {"num_blocks": 8}}  # (not a list: num_hidden_layers' other name, which must agree with it)
# Families compared in fp32, where bf16 cannot be judged: gpt-oss's top 4 of 32 experts at random
# weights are near ties that bf16 rounding flips (on the CPU HF's own bf16 model chose other
# experts for 21% of the tokens of its second layer; on the H200 its logits were at cosine 0.82
# of its fp32 ones), so only fp32 against fp32 routes the same tokens the same way. So do the top 6
# or 8 of 128 by sigmoid score (dots.llm1: on the H200 HF's own bf16 model was at cosine 0.988 of
# its fp32 one, under the 0.995 floor; Solar Open routes the same way), and EXAONE MoE's top 8 of 64 by
# sigmoid score on OLMo 2's sizes (on the H200 it matched in fp32 every iteration; in bf16 one of
# 21 checks, a 1-token prompt's, was at cosine 0.9968 where HF's own bf16 was at 0.99995). MiniMax-M2
# and Hy3 choose their top 8 of 256 / 192 by sigmoid score as dots.llm1 does, Flint its top 6 of 256: fp32 from the
# start (not yet measured in bf16), and Trinity Mini its top 8 of 128, GLM-4.7-Flash its top 4 of 64, LFM2-8B-A1B its
# top 4 of 32 (sigmoid score + bias).
# The MoE hybrids likewise from the start: Qwen3-Next's top 10 of 512 and Qwen3.5-35B-A3B's top 8 of 256 by softmax,
# Granite-4.0-H-Tiny's top 6 of 64 (their dense kin, Qwen3.5-27B, Bamba, Nemotron-H, Falcon-H1, LFM2-1.2B, in bf16),
# Kimi-Linear-48B-A3B's top 8 of 256 by sigmoid score + bias, Jamba-Mini's top 2 of 16 by softmax, Nemotron-3-Nano's
# top 6 of 128 by sigmoid score + bias (not yet measured in bf16). Phi-3.5-MoE's top 2 of 16 by its sparsemixer
# router, whose relative band (2 x 0.01 of the best logit) bf16 logits can put an expert on either side of: fp32 from
# the start (not yet measured in bf16); MiMo-V2-Flash's top 8 of 256 by sigmoid score + bias likewise.
# Granite-4.0-SWA's random model is one bf16 cannot judge at all: on the H200 HF's own bf16 model was at
# cosine 0.19 of its fp32 one (ours at 0.74). DBRX's top 4 of 16 by softmax: on the H200 in bf16 one check
# was at cosine 0.9941 where HF's own bf16 was at 0.9988 (not yet looked into); in fp32 every check passed.
FP32 = {"dbrx-132b", "granite-swash-2b", "gpt-oss-20b", "dots.llm1", "solar-open-100b", "exaone_moe", "minimax-m2",
        "hy3-preview", "flint", "trinity-mini", "glm-4.7-flash", "lfm2-8b-a1b", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b",
        "granite-4.0-h-tiny", "kimi-linear-48b-a3b", "jamba-mini", "nemotron-3-nano-30b-a3b", "phi-3.5-moe",
        "mimo-v2-flash",
        # Mistral-Small-4's top 4 of 128 experts by softmax probability, which transformers takes in the activation
        # dtype: fp32 from the start (not yet measured in bf16)
        "mistral-small-4",
        # GLM-5's top 8 of 256 experts by sigmoid score + bias (DeepSeek-V3.2's rows are dense layers only, in bf16, as
        # DeepSeek-V3's): fp32 from the start (not yet measured in bf16)
        "glm-5",
        # A.X-K1's top 8 of 192 experts by sigmoid score + bias among the best 4 of 8 groups: fp32 from the start (not
        # yet measured in bf16)
        "a.x-k1",
        # A.X-K2's top 8 of 128 experts by sigmoid score + bias (no groups): fp32 from the start (not yet measured in
        # bf16)
        "a.x-k2",
        # Kolibri-1's top 6 of 384 experts by logit + bias: fp32 from the start (not yet measured in bf16)
        "kolibri-1",
        # Laguna-XS.2's top 8 of 256 experts by sigmoid score + bias: fp32 from the start (not yet measured in bf16)
        "laguna-xs.2",
        # LongCat-Flash's top 12 of 512 experts and 256 identity ones by softmax probability + bias: fp32 from the start
        # (bf16 does not fit: HF's bf16 copy beside its fp32 model and the bf16 tensors)
        "longcat-flash-chat",
        # Ling-3.0-Flash's top 8 of 512 experts by sigmoid score + bias among the best 4 of 8 groups, and its KDA's
        # decay rounded to the model's dtype: fp32 from the start (not yet measured in bf16)
        "ling-3.0-flash",
        # (HF's Mamba and Mamba-2 models keep their residual stream in fp32, `residual_in_fp32`; ours is in the model's
        # dtype, so in bf16 HF's own model stays the closer one: checked in fp32, where the two are the same math)
        "mamba-2.8b", "mamba-codestral-7b",
        # JetMoE-8B's top 2 of 8 attention and MLP experts by softmax over bf16 logits: fp32 from the start (not yet
        # measured in bf16)
        "jetmoe-8b",
        # Gemma-3n-E2B's random model is one bf16 cannot judge: on the H200 HF's own bf16 model was at cosine 0.38 of
        # its fp32 one at the first step (ours at 0.41)
        "gemma-3n-e2b",
        # MiniMax-Text-01's top 2 of 32 experts and its bf16 lightning state in HF: on the H200 in bf16 ours was at cosine
        # 0.9576 at the second step where HF's own bf16 model was at 0.9571
        "minimax-text-01",
        # Gemma-4-26B-A4B's top 8 of 128 experts by softmax, and Gemma-4-E2B (per-layer inputs as Gemma 3n's): fp32 from
        # the start (not yet measured in bf16)
        "gemma-4-26b-a4b", "gemma-4-e2b",
        # Zamba-7B's random model is one bf16 cannot judge: on the H200 HF's own bf16 model was at cosine 0.949 of its
        # fp32 one at the first step (ours at 0.960; its Mamba-1 layers keep no fp32 residual, as the Mamba rows above)
        "zamba-7b",
        # ZAYA1-8B's top 1 of 16 experts (or the skip class) by softmax probability + balancing bias, which
        # transformers takes in the activation dtype: fp32 from the start (not yet measured in bf16)
        "zaya1-8b",
        # Dots3's and HY-V4's top 8 of 256 experts by sigmoid score + bias: fp32 from the start (not yet measured in
        # bf16)
        "dots3-note-prev", "hy4-preview",
        # MiniMax-M3's top 4 of 128, Beam's top 8 of 256 (in groups) and Inkling's top 6 by sigmoid score + bias, and
        # Aria's top 6 of 64 by softmax: fp32 from the start (not yet measured in bf16)
        "minimax-m3", "beam-1.0-501b-a23b", "inkling", "aria", "inkling2-small",
        # DeepSeek-V4's top 6 of 256 by sqrt(softplus) score (the first layers by a token-id table), Qwen4-Exp's top k
        # of 512 by softmax: fp32 from the start
        "deepseek-v4-flash", "qwen4-exp"}


def _hf_at_published_width(cfg: dict, classes: dict, seed: int, dtype: torch.dtype = torch.bfloat16):
    """HF's model of `classes[model_type]` for the config dict `cfg`, random weights drawn with
    `seed` on the GPU in fp32 (eager attention), and its tensors in `dtype` (the prefix stripped)."""
    from test_decoder_families import CONFIG_CLASSES

    cfg = dict(cfg)
    model_type = cfg.pop("model_type")
    if model_type not in CONFIG_CLASSES:  # (a family newer than this transformers: carry a newer one)
        pytest.skip(f"transformers {transformers.__version__} has no model_type {model_type}")
    hf_cfg = getattr(transformers, CONFIG_CLASSES[model_type])(**cfg)
    torch.manual_seed(seed)
    # The experts as modeling_*.py writes them (a loop over the experts), not transformers' default
    # grouped-GEMM path for MoE models: the reference is the model's own math.
    experts = {"experts_implementation": "eager"} if "num_experts_per_tok" in cfg or cfg.get("enable_moe_block") \
        else {}
    with torch.device(CUDA):
        hf = getattr(transformers, classes[model_type])._from_config(hf_cfg, attn_implementation="eager",
                                                                     dtype=torch.float32, **experts).eval()
    with torch.no_grad():  # HF starts gpt-oss's expert biases at zero and its sinks near it: make them matter
        for name, p in hf.named_parameters():
            if name.endswith("_bias"):
                p.add_(torch.randn_like(p) * 0.02)
            elif name.endswith(".sinks"):
                p.add_(torch.randn_like(p))
            elif name.endswith("router.gate.weight") and not p.any():  # (AFMoE's router starts at zero)
                p.normal_(0.0, 0.02)
            elif name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):  # (Apertus's xIELU scalars: off their init)
                p.add_(torch.randn_like(p) * 0.5)
            elif name.endswith("altup.correct_output_scale"):  # (Gemma 3n's starts at zero: the per-layer inputs on)
                p.add_(torch.randn_like(p))
            elif name.endswith("qk_norm.temp"):  # (ZAYA's key temperatures start at zero: keys on)
                p.add_(torch.randn_like(p))
            elif model_type in ("gemma3n_text", "gemma4_text", "gemma4_unified_text") and \
                    name.endswith("self_attn.q_norm.weight"):
                # Gemma 3n scores unscaled (scale 1): with q and k normed to 1 its 256-wide heads' scores spread
                # at sqrt(256) = 16, near-argmax attention that over 30 layers turns fp32 rounding into other
                # logits (on the CPU, 30 layers of its width and heads, MLPs of 512, a 700-token prompt: HF against
                # itself with its weights * (1 + 1e-7 randn) at cosine 0.907, ours against HF at 0.973). q's norm
                # at head_dim ** -0.5, the spread a 1 / sqrt(d) scale gives, makes it judgeable: both at 1.000000.
                # Gemma 4 scores unscaled too, its heads 256 and 512 wide (each layer's own: the norm's width)
                p.mul_(p.shape[0] ** -0.5)
    return hf, {k: v.to(dtype) for k, v in strip_prefixes_of(hf.state_dict()).items()}


@pytest.mark.parametrize("name", FAMILY_SHAPES)
def test_family_at_its_published_width_matches_hf_on_gpu(name):
    """Each family at its published width, heads and vocabulary (8 of its layers, or LAYERS', for time: the
    kernels see the real shapes either way), random weights. Ours in bf16 against HF eager in
    fp32 on the same weights, every iteration (prompts in two chunks beside decodes, one long
    enough to cross Gemma 3's 512-token window): at least as close as HF's own bf16 model is,
    less a margin for rounding (cosine 0.002), and never below 0.995; FP32's families in fp32, at
    0.999 or closer."""
    from tritonformer.client.model_shapes import DECODER_SHAPES

    _check_every_iteration_against_hf({**DECODER_SHAPES[name], "num_hidden_layers": LAYERS.get(name, 8),
                                       **LAYER_LISTS.get(name, {})},
                                      torch.float32 if name in FP32 else torch.bfloat16)


# Families without a published shape here, on OLMo-2-7B's (hidden 4,096, 32 heads of 128; 4 layers; a
# 32,000-token vocabulary, the special ids inside it):
# each one's own block, norms, rotary and windows through the GPU kernels.
ON_OLMO2_SHAPE = {
    "exaone4": {"model_type": "exaone4", "num_key_value_heads": 8, "sliding_window": 512, "sliding_window_pattern": 2},
    "cohere2": {"model_type": "cohere2", "num_key_value_heads": 8, "sliding_window": 512,
                "layer_types": ["sliding_attention", "full_attention"] * 2},
    "hunyuan": {"model_type": "hunyuan_v1_dense", "head_dim": 128, "num_key_value_heads": 8,
                "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}},
    "ministral3": {"model_type": "ministral3", "head_dim": 128, "num_key_value_heads": 8, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 1024,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}},
    "vaultgemma": {"model_type": "vaultgemma", "head_dim": 128, "num_key_value_heads": 8, "sliding_window": 512},
    "internlm3": {"model_type": "internlm3", "head_dim": 128, "num_key_value_heads": 8, "attention_bias": True,
                  "mlp_bias": True},
    "hunyuan_moe": {"model_type": "hunyuan_v1_moe", "head_dim": 128, "num_key_value_heads": 8, "num_experts": 64,
                    "moe_topk": 8, "intermediate_size": 3072, "rope_parameters": {
                        "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}},
    "exaone_moe": {"model_type": "exaone_moe", "num_key_value_heads": 8, "sliding_window": 512,
                   "sliding_window_pattern": 2, "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
                   "first_k_dense_replace": 1},
    # Cohere Compass text: windowed layers at one base, global ones without a rotary (NoPE), biases on the attention
    "cohere_compass": {"model_type": "cohere_compass_text", "num_key_value_heads": 8, "sliding_window": 512,
                       "layer_types": ["sliding_attention", "full_attention"] * 2, "attention_bias": True,
                       "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
                                           "full_attention": None}},
}


@pytest.mark.parametrize("name", sorted(ON_OLMO2_SHAPE))
def test_family_on_a_7b_shape_matches_hf_on_gpu(name):
    """As the published-width test, for the families checked here on OLMo-2-7B's sizes."""
    from tritonformer.client.model_shapes import DECODER_SHAPES

    _check_every_iteration_against_hf({**DECODER_SHAPES["olmo-2-7b"], "num_hidden_layers": 4, "vocab_size": 32000,
                                       "pad_token_id": 1, "eos_token_id": 2, **ON_OLMO2_SHAPE[name]},
                                      torch.float32 if name in FP32 else torch.bfloat16)


def _check_every_iteration_against_hf(cfg: dict, dtype: torch.dtype = torch.bfloat16):
    """Ours in `dtype` against HF eager in fp32 on the same random weights, every iteration (see
    test_family_at_its_published_width_matches_hf_on_gpu)."""
    from test_decoder_families import HF_CLASSES  # the families' HF classes, kept in one place

    hf, state = _hf_at_published_width(cfg, HF_CLASSES, seed=12, dtype=dtype)
    ours = load_decoder(hf.config.to_dict(), state, CUDA, dtype)
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16) if dtype == torch.bfloat16 else None
    gen = torch.Generator().manual_seed(13)
    vocab = min(cfg["vocab_size"], 32000)
    # (GPT-1's learnt positions end at 512: the long prompt kept short enough for the six steps after it)
    positions = cfg.get("max_position_embeddings") or cfg.get("n_positions") or 700 + 8
    prompts = [torch.randint(3, vocab, (min(n, positions - 8),), generator=gen).tolist() for n in (700, 1, 57)]
    run = PagedSteps(ours, num_blocks=512, block_size=16)
    histories = [list(p) for p in prompts]
    logits = run.step([(0, prompts[0][:100])] + [(i, p) for i, p in enumerate(prompts) if i])
    logits = torch.cat([run.step([(0, prompts[0][100:])]), logits[1:]])
    for step in range(6):
        with torch.inference_mode():
            for i, h in enumerate(histories):
                ids = torch.tensor([h], device=CUDA)
                ref = hf(ids).logits[0, -1]
                got = _cos_min(logits[i : i + 1], ref[None])
                if hf_bf16 is None:  # fp32 against fp32
                    assert got >= 0.999, (step, i, got)
                    continue
                floor = _cos_min(hf_bf16(ids).logits[0, -1][None], ref[None])
                assert got >= min(floor - 0.002, 0.999) and got >= 0.995, (step, i, got, floor)
        nxt = logits.argmax(-1).tolist()
        for h, t in zip(histories, nxt):
            h.append(t)
        logits = run.step([(i, [t]) for i, t in enumerate(nxt)])


@pytest.mark.parametrize("name", ["qwen3-8b", "gemma-2-9b"])
def test_decoder_family_as_an_encoder_matches_hf_on_gpu(name):
    """A decoder family as the embedder (models/decoder_encoder.py) at its published width (4
    layers), bf16 on the GPU (cosine at least 0.995): every row of packed sequences, the longest
    past Gemma 2's window when shrunk to 64, against HF's `*Model` last_hidden_state of each
    sequence alone in fp32; then its CUDA graphs against its eager forward."""
    from test_decoder_encoders import BASE_CLASSES
    from tritonformer.backend.models.encoder import load_encoder
    from tritonformer.client.model_shapes import DECODER_SHAPES

    cfg = {**DECODER_SHAPES[name], "num_hidden_layers": 4}
    if "sliding_window" in cfg:
        cfg["sliding_window"] = 64
    hf, state = _hf_at_published_width(cfg, BASE_CLASSES, seed=3)
    ours = load_encoder(hf.config.to_dict(), state, CUDA, torch.bfloat16)
    _check_encoder(hf, ours, [1, 9, 300, 130, 77], min(cfg["vocab_size"], 32000), cos=0.995)
    # and its CUDA graphs (a padding sequence, empty ones) replay what it computes eagerly
    from tritonformer.backend.cuda_graphs import EncoderGraphs

    lengths = [3, 40, 17]
    _, ids, cu = _packed(lengths, 32000, torch.Generator().manual_seed(6))
    eager = ours.forward(ids, cu, max(lengths))
    graphs = EncoderGraphs(ours)
    for _ in range(2):
        assert _cos_min(graphs.forward(ids, lengths), eager) >= 0.9999  # (the padded shapes' tiles may differ)
    assert graphs.replays == 2
