"""FP8 (E4M3) linears on the GPU: accuracy on the real checkpoints and speed where it matters, one table.

    python3 tools/gpu/fp8_report.py --smollm2 DIR_OR_GGUF --minilm DIR [--parts accuracy,speed]

(a) accuracy, fp16 activations:
  * SmolLM2-135M-Instruct (the generator's default checkpoint: the converted folder that
    backend/checkpoints/defaults.py caches, or the package's GGUF file, 98 MB, converted here
    first, ~20 s; the converted folder is 517 MB): perplexity of tests/data/fp8_eval.txt (windows of 1,024 tokens, each a
    fresh sequence), fp16 vs fp8 linears as `quantization: fp8` loads them (the first and last
    layers 16-bit), and two variants: the output head fp8 too; the head and every layer. Greedy
    decoding of 128 tokens (EOS ignored) after each of 20 prompts, one sequence at a time:
    identical continuations, the mean agreeing prefix, and teacher-forced agreement (the fp8
    model fed fp16's tokens: the share of steps where its argmax is fp16's token).
  * all-MiniLM-L6-v2 (a folder, e.g. tools/carry_minilm_fp16.py's fp16 copy): cosine of our
    pooled embeddings, fp16 and fp8 (as `quantization: fp8` loads it, and with every layer FP8),
    to fp32 Hugging Face over tests/test_integration_embedder.py's texts. `--cpu` runs the
    accuracy part in fp32 on the CPU (either model, or both).

(b) speed (random weights):
  * a decode step on the llama-3.1-8b shape (client/model_shapes.py), batch 1 and 64, context
    ~128: the model's forward replayed from its decode CUDA graph, fp16 vs fp8 (weight-only up
    to fp8.WEIGHT_ONLY_MAX_ROWS; at batch 64 also through the FP8 tensor cores; at batch 1
    also with every layer FP8), against the weight-read floor (bytes a step reads: layers,
    final norm, output head) at the copy bandwidth measured in the run;
  * bert-base at 64 sequences x 512 tokens: the encoder's forward, bf16 vs fp8;
  * one GEMM of M=32768, K=768, N=3072 (bert-base's FFN up-projection at that batch): bf16
    cuBLAS vs torch._scaled_mm with row-wise scales, alone and with the per-token activation
    quantisation kernel;
  * the FP8 FFN's activation at that batch (`[32768, 3072]` bf16): the GELU pass then the down
    projection's quantisation pass (the unfused path) vs the fused act + quantise kernel
    (triton_fp8.act_quantize_rows_fp8, what the encoder runs);
  * `--parts encoder-profile`: bert-base's (64, 512) forward under torch.profiler, bf16 and fp8,
    its kernels' time per forward by name, and the activation passes' sum (`_quantize_rows_kernel`,
    `_act_quantize_rows_kernel`, `_bias_gelu_kernel`);
  * `--parts crossover`: the llama-3.1-8b FP8 decode step at batches 8-64, weight-only against
    the FP8 tensor cores (where fp8.WEIGHT_ONLY_MAX_ROWS belongs).

tests/data/fp8_eval.txt is real English prose: the module docstrings of Python 3.11's standard
library (heapq's `__about__` essay, then sched, io, cmd, turtle, ast, copy, http.server,
tempfile, subprocess), with their code examples removed; ~4,300 SmolLM2 tokens. Expect 2-4
minutes on an H100, most of it compiling and autotuning kernels.
"""
from __future__ import annotations

import argparse
import ast
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village by the sea,",
    "The three primary colors are", "To make a good cup of tea, you should first",
    "Water boils at a temperature of", "The theory of relativity was developed by",
    "A healthy breakfast usually includes", "The largest planet in our solar system is",
    "In computer science, a linked list is", "The best way to learn a new language is",
    "Photosynthesis is the process by which", "The French Revolution began in the year",
    "My favourite book is about a boy who", "To sort a list of numbers in Python, you can",
    "The Great Wall of China was built to", "When the sun sets over the mountains,",
    "An apple a day keeps", "The main ingredients of bread are",
    "Here is a short poem about the ocean:", "The difference between weather and climate is",
]
ROWS: list[tuple] = []  # (part, measure, baseline, fp8, comparison)


def row(part: str, measure: str, baseline: str, fp8: str, comparison: str) -> None:
    ROWS.append((part, measure, baseline, fp8, comparison))
    print(f"  {part} | {measure} | {baseline} | {fp8} | {comparison}", flush=True)


def quantize_every_layer(model):
    """The variant this report compares with the product: every layer's linears FP8, the first
    and last layers' too (quantization fp8 keeps a decoder's and a BERT encoder's edge layers
    16-bit)."""
    from tritonformer.backend.quantization import quantize_model

    return quantize_model(model, keep_edge_layers=False)


# ---- (a) accuracy ------------------------------------------------------------------------------

def decode(model, prompt: list[int], steps: int, forced: list[int] | None = None) -> list[int]:
    """Greedy argmax after the prompt and after each of `steps` tokens: its own (forced None)
    or `forced`'s (teacher-forced); one sequence, one token per iteration."""
    from tritonformer.backend.decoder.batch import BatchEntry, build_batch

    blocks = -(-(len(prompt) + steps + 1) // 16)
    cache = model.new_kv_cache(blocks + 1, 16)
    table = list(range(blocks))
    out = [int(model.forward(build_batch([BatchEntry(prompt, 0, table, True)], 16, model.device), cache)[0].argmax())]
    for i in range(steps - 1):
        token = out[-1] if forced is None else forced[i]
        logits = model.forward(build_batch([BatchEntry([token], len(prompt) + i, table, True)], 16, model.device),
                               cache)
        out.append(int(logits[0].argmax()))
    return out


def smollm2_accuracy(folder: Path, dev, dtype=torch.float16) -> None:
    import tempfile

    from tokenizers import Tokenizer

    if folder.suffix == ".gguf":  # the package's file: converted as the server's cache does
        from tritonformer.backend.checkpoints import convert_gguf_to_hf

        folder = convert_gguf_to_hf(folder, Path(tempfile.mkdtemp(prefix="smollm2-")), progress=False)

    from tritonformer.backend import quantization
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
    from tritonformer.client.perplexity import perplexity
    from tritonformer.backend.models.decoder import load_decoder

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tok.encode((REPO / "tests" / "data" / "fp8_eval.txt").read_text()).ids
    config, state = load_config(folder), load_state_dict(folder)
    base = load_decoder(config, state, dev, dtype)
    quant = load_decoder(config, state, dev, dtype, quantization="fp8")
    with torch.inference_mode():
        ppl = perplexity(base, ids), perplexity(quant, ids)
        head = load_decoder(config, state, dev, dtype, quantization="fp8")
        quantization.quantize_model(head, head=True)
        ppl_head = perplexity(head, ids)
        ppl_all = perplexity(quantize_every_layer(head), ids)
        del head
        row("SmolLM2-135M", f"perplexity, fp8_eval.txt ({len(ids)} tokens)", f"{ppl[0]:.3f}", f"{ppl[1]:.3f}",
            f"{ppl[1] / ppl[0]:.4f}x (target <= 1.02x)")
        row("SmolLM2-135M", "perplexity, fp8 output head too", f"{ppl[0]:.3f}", f"{ppl_head:.3f}",
            f"{ppl_head / ppl[0]:.4f}x")
        row("SmolLM2-135M", "perplexity, head and every layer fp8", f"{ppl[0]:.3f}", f"{ppl_all:.3f}",
            f"{ppl_all / ppl[0]:.4f}x")
        same, prefix, forced_agree, steps = 0, [], [], 128
        for text in PROMPTS:
            prompt = tok.encode(text).ids
            ref = decode(base, prompt, steps)
            ours = decode(quant, prompt, steps)
            forced = decode(quant, prompt, steps, forced=ref)
            same += ours == ref
            prefix.append(next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), steps))
            forced_agree.append(sum(a == b for a, b in zip(forced, ref)) / steps)
    row("SmolLM2-135M", f"greedy {steps} tokens x {len(PROMPTS)} prompts: identical", "-", f"{same}/{len(PROMPTS)}",
        f"mean agreeing prefix {statistics.mean(prefix):.1f} tokens")
    row("SmolLM2-135M", "greedy, teacher-forced top-1 agreement", "-", f"{statistics.mean(forced_agree):.2%}",
        f"min over prompts {min(forced_agree):.2%}")


def embedder_texts() -> list[str]:
    """TEXTS of tests/test_integration_embedder.py, read without importing the test module."""
    source = (REPO / "tests" / "test_integration_embedder.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TEXTS" for t in node.targets):
            # literals and a repetition ("..." * 30): evaluated with no names in scope
            return [eval(compile(ast.Expression(body=e), "TEXTS", "eval"), {"__builtins__": {}})
                    for e in node.value.elts]
    raise RuntimeError("TEXTS not found in tests/test_integration_embedder.py")


def minilm_accuracy(folder: Path, dev, dtype=torch.float16) -> None:
    import transformers

    from tritonformer.backend import quantization
    from tritonformer.backend.checkpoints.weights import load_config, load_state_dict
    from tritonformer.kernels import pool_sequences

    texts = embedder_texts()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModel.from_pretrained(folder).float().to(dev).eval()
    seqs = [tok(t)["input_ids"] for t in texts]
    ids = torch.tensor([i for s in seqs for i in s], device=dev)
    cu = torch.tensor([0, *torch.tensor([len(s) for s in seqs]).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    with torch.inference_mode():
        want = torch.stack([torch.nn.functional.normalize(
            hf(torch.tensor([s], device=dev)).last_hidden_state[0].float().mean(0), dim=0) for s in seqs])
        cos = {}
        for name in ("none", "fp8", "every layer"):
            model = quantization.load_encoder(load_config(folder), load_state_dict(folder), dev, dtype,
                                              "none" if name == "none" else "fp8")
            if name == "every layer":
                quantize_every_layer(model)
            got = pool_sequences(model.forward(ids, cu), cu, "mean", True)
            cos[name] = torch.nn.functional.cosine_similarity(got.float(), want, dim=-1)
    for name, label in (("fp8", ""), ("every layer", ", every layer fp8 (first and last too)")):
        row("all-MiniLM-L6-v2", f"embedding cosine to fp32 HF{label}, min / mean over {len(texts)} texts",
            f"{cos['none'].min():.5f} / {cos['none'].mean():.5f}", f"{cos[name].min():.5f} / {cos[name].mean():.5f}",
            "target min >= 0.995")


# ---- (b) speed ---------------------------------------------------------------------------------

def decode_step_ms(model, batch: int, context: int = 128, reps: int = 30) -> float:
    """ms per decode iteration of `batch` sequences at ~`context` keys: the decode graph's
    replays, each one iteration further (the engine's multi-step rounds)."""
    from tritonformer.backend.decoder.batch import BatchEntry
    from tritonformer.backend.decoder.graphs import DecodeGraphs

    warm = 5
    per_seq = -(-(context + warm + reps + 2) // 16)
    cache = model.new_kv_cache(batch * per_seq + 1, 16)
    cache.data.zero_()  # keys of the context never written: zeros, not whatever the memory held
    last_ids = torch.zeros(batch, dtype=torch.long, device=model.device)
    graphs = DecodeGraphs(model, cache, batch, per_seq, last_ids)
    entries = [BatchEntry([1 + r], context, list(range(r * per_seq, (r + 1) * per_seq)), True) for r in range(batch)]
    replay, _, _ = graphs.load(entries, steps=[warm + reps] * batch)
    for _ in range(warm):
        replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        replay()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / reps * 1e3
    del graphs, replay, cache
    torch.cuda.empty_cache()
    return ms


def cuda_ms(fn, reps: int = 20) -> float:
    """Median ms of fn() over `reps` CUDA-event-timed calls, after 3 warm ones."""
    from tritonformer.client.gpu_measure import cuda_ms as timed

    return timed(fn, reps, warmup=3)


def decoder_speed(dev, bandwidth: float) -> None:
    from tritonformer.backend import quantization
    from tritonformer.client.gpu_measure import read_bytes_per_step
    from tritonformer.client.model_shapes import random_decoder
    from tritonformer.kernels import fp8

    dtype = torch.float16
    model = random_decoder("llama-3.1-8b", dev, dtype, max_model_len=1024)
    floor16 = read_bytes_per_step(model) / bandwidth * 1e3
    with torch.inference_mode():
        b1_16, b64_16 = decode_step_ms(model, 1), decode_step_ms(model, 64)
        quantization.prepare({}, "fp8", dev, dtype)
        quantization.quantize_model(model)  # in place: each fp16 weight freed as its FP8 copy replaces it
        torch.cuda.empty_cache()
        floor8 = read_bytes_per_step(model) / bandwidth * 1e3
        saved = fp8.WEIGHT_ONLY_MAX_ROWS
        try:
            fp8.WEIGHT_ONLY_MAX_ROWS = 64  # 64 rows weight-only, in the small GEMM
            b1_8, b64_8 = decode_step_ms(model, 1), decode_step_ms(model, 64)
            fp8.WEIGHT_ONLY_MAX_ROWS = 32  # 64 rows through the FP8 tensor cores (the default)
            b64_mm = decode_step_ms(model, 64)
        finally:
            fp8.WEIGHT_ONLY_MAX_ROWS = saved
        quantize_every_layer(model)
        torch.cuda.empty_cache()
        floor_all = read_bytes_per_step(model) / bandwidth * 1e3
        b1_all = decode_step_ms(model, 1)
    row("llama-3.1-8b decode", f"batch 1 ms (weight-read floor {floor16:.3f} / {floor8:.3f})", f"{b1_16:.3f}",
        f"{b1_8:.3f}", f"{b1_8 / b1_16:.3f}x fp16 (target <= 0.6x); {b1_8 / floor8:.2f}x its floor")
    row("llama-3.1-8b decode", f"batch 1 ms, every layer fp8 (floor {floor_all:.3f})",
        f"{b1_16:.3f}", f"{b1_all:.3f}", f"{b1_all / b1_16:.3f}x fp16; {b1_all / floor_all:.2f}x its floor")
    row("llama-3.1-8b decode", "batch 64 ms, fp8 weight-only (small GEMM)", f"{b64_16:.3f}", f"{b64_8:.3f}",
        f"{b64_8 / b64_16:.3f}x fp16; {b64_8 / floor8:.2f}x the floor")
    row("llama-3.1-8b decode", "batch 64 ms, fp8 on FP8 tensor cores (_scaled_mm)", f"{b64_16:.3f}", f"{b64_mm:.3f}",
        f"{b64_mm / b64_16:.3f}x fp16")
    del model
    torch.cuda.empty_cache()


def route_crossover(dev, batches=(8, 16, 24, 32, 48, 64)) -> None:
    """The llama-3.1-8b FP8 decode step at each batch through both many-row routes: weight-only
    (the GEMV / small GEMM read E4M3 weights, activations 16-bit) and the FP8 tensor cores
    (activations quantised per token, _scaled_mm): where fp8.WEIGHT_ONLY_MAX_ROWS should sit."""
    from tritonformer.backend import quantization
    from tritonformer.client.model_shapes import random_decoder
    from tritonformer.kernels import fp8

    model = random_decoder("llama-3.1-8b", dev, torch.float16, max_model_len=1024)
    saved = fp8.WEIGHT_ONLY_MAX_ROWS
    with torch.inference_mode():
        quantization.prepare({}, "fp8", dev, torch.float16)
        quantization.quantize_model(model)
        torch.cuda.empty_cache()
        try:
            for b in batches:
                fp8.WEIGHT_ONLY_MAX_ROWS = b
                weight_only = decode_step_ms(model, b)
                fp8.WEIGHT_ONLY_MAX_ROWS = b - 1
                cores = decode_step_ms(model, b)
                row("llama-3.1-8b fp8 decode", f"batch {b} ms: weight-only / FP8 tensor cores", f"{weight_only:.3f}",
                    f"{cores:.3f}", f"tensor cores {weight_only / cores:.2f}x faster")
        finally:
            fp8.WEIGHT_ONLY_MAX_ROWS = saved
    del model
    torch.cuda.empty_cache()


def encoder_speed(dev) -> None:
    import transformers

    from tritonformer.backend import quantization
    from tritonformer.backend.checkpoints.weights import strip_prefixes_of

    cfg = transformers.BertConfig()  # bert-base
    torch.manual_seed(0)
    state = strip_prefixes_of(transformers.BertModel(cfg).eval().state_dict())
    seqs, length = 64, 512
    g = torch.Generator(device=dev).manual_seed(0)
    ids = torch.randint(1000, 30000, (seqs * length,), device=dev, generator=g)
    cu = torch.arange(0, seqs * length + 1, length, dtype=torch.int32, device=dev)
    ms = {}
    with torch.inference_mode():
        for name in ("none", "fp8"):
            model = quantization.load_encoder(cfg.to_dict(), state, dev, torch.bfloat16, name)
            ms[name] = cuda_ms(lambda m=model: m.forward(ids, cu, max_seqlen=length), reps=10)
            del model
    row("bert-base encoder", f"forward ms, {seqs} x {length} tokens", f"{ms['none']:.2f} (bf16)",
        f"{ms['fp8']:.2f}", f"{ms['none'] / ms['fp8']:.2f}x faster (target > 1)")


_ACTIVATION_PASSES = ("_quantize_rows_kernel", "_act_quantize_rows_kernel", "_bias_gelu_kernel")


def encoder_profile(dev, top: int = 14) -> None:
    """Where bert-base's (64, 512) forward spends its GPU time, bf16 against fp8: torch.profiler's CUDA
    kernels over 5 forwards, summed by kernel name (us per forward), the largest `top` of each side."""
    import transformers
    from torch.profiler import ProfilerActivity, profile

    from tritonformer.backend import quantization
    from tritonformer.backend.checkpoints.weights import strip_prefixes_of

    cfg = transformers.BertConfig()
    torch.manual_seed(0)
    state = strip_prefixes_of(transformers.BertModel(cfg).eval().state_dict())
    seqs, length, reps = 64, 512, 5
    ids = torch.randint(1000, 30000, (seqs * length,), device=dev)
    cu = torch.arange(0, seqs * length + 1, length, dtype=torch.int32, device=dev)
    with torch.inference_mode():
        for name in ("none", "fp8"):
            model = quantization.load_encoder(cfg.to_dict(), state, dev, torch.bfloat16, name)
            for _ in range(3):
                model.forward(ids, cu, max_seqlen=length)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    model.forward(ids, cu, max_seqlen=length)
                torch.cuda.synchronize()
            rows = sorted(((e.device_time_total / reps, e.count / reps, e.key) for e in prof.key_averages()
                           if e.device_time_total > 0), reverse=True)
            total = sum(r[0] for r in rows)
            label = "bf16" if name == "none" else "fp8"
            print(f"\n### bert-base (64, 512) {label}: kernels {total:,.0f} us per forward")
            print("| us per forward | launches | kernel |\n|---:|---:|---|")
            for us, n, key in rows[:top]:
                print(f"| {us:,.0f} | {n:.0f} | {key[:110]} |")
            passes = {key: (us, n) for us, n, key in rows if any(k in key for k in _ACTIVATION_PASSES)}
            print(f"\nactivation passes (quantise, act + quantise, GELU): {sum(u for u, _ in passes.values()):,.0f} "
                  f"us per forward: " + ", ".join(f"{k} {u:,.0f} us x {n:.0f}" for k, (u, n) in passes.items()))
            del model
            torch.cuda.empty_cache()


def gemm_speed(dev) -> None:
    from tritonformer.kernels import fp8, triton_fp8

    m, k, n = 32768, 768, 3072
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device=dev, generator=g) * k ** -0.5).to(torch.bfloat16)
    wq = fp8.quantize_weight(w)
    aq, sa = triton_fp8.quantize_rows_fp8(a)
    out_dtype = fp8.scaled_mm_dtype(dev, torch.bfloat16)
    if out_dtype is None:
        row("GEMM 32768x768x3072", "torch._scaled_mm with row-wise scales", "-", "unsupported here", "-")
        return
    bf16 = cuda_ms(lambda: torch.mm(a, w.t()))
    mm = cuda_ms(lambda: torch._scaled_mm(aq, wq.data.t(), scale_a=sa, scale_b=wq.scale.view(1, -1),
                                          out_dtype=out_dtype))
    both = cuda_ms(lambda: triton_fp8.scaled_mm(a, wq))
    quant = cuda_ms(lambda: triton_fp8.quantize_rows_fp8(a))
    tflops = lambda t: 2 * m * k * n / (t * 1e-3) / 1e12  # noqa: E731
    row("GEMM 32768x768x3072", "ms (TFLOP/s): bf16 cuBLAS vs _scaled_mm alone", f"{bf16:.3f} ({tflops(bf16):.0f})",
        f"{mm:.3f} ({tflops(mm):.0f})", f"{bf16 / mm:.2f}x faster")
    row("GEMM 32768x768x3072", "ms: with per-token quantisation of A (kernel alone)", f"{bf16:.3f}",
        f"{both:.3f} ({quant:.3f})", f"{bf16 / both:.2f}x faster (target > 1)")


def act_quantize_speed(dev) -> None:
    """The FP8 FFN's activation on bert-base's (64, 512) up-projection output: the unfused path's
    two passes (bias_gelu's kernel in place, then the down projection's quantisation) against the
    fused act + quantise kernel, which never writes the bf16 activation."""
    from tritonformer.kernels import dispatch, triton_fp8

    m, n = 32768, 3072
    h = torch.randn(m, n, device=dev, generator=torch.Generator(device=dev).manual_seed(0)).to(torch.bfloat16)
    work = torch.empty_like(h)  # (the path runs the GELU in place: the same bytes read and written)
    unfused = cuda_ms(lambda: triton_fp8.quantize_rows_fp8(dispatch.bias_gelu(h, None, "none", out=work)))
    fused = cuda_ms(lambda: triton_fp8.act_quantize_rows_fp8(h, "gelu"))
    row("FFN activation 32768x3072 bf16", "ms: GELU pass + quantise pass vs act + quantise in one",
        f"{unfused:.3f}", f"{fused:.3f}", f"{unfused / fused:.2f}x faster")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", type=Path, help="the SmolLM2-135M-Instruct folder, or its .gguf file")
    ap.add_argument("--minilm", type=Path, help="the all-MiniLM-L6-v2 folder")
    ap.add_argument("--parts", default="accuracy,speed")
    ap.add_argument("--cpu", action="store_true",
                    help="the accuracy part alone (SmolLM2, MiniLM), on the CPU in fp32 (FP8 emulated by the "
                         "references)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if args.cpu:
        if args.smollm2:
            smollm2_accuracy(args.smollm2, torch.device("cpu"), torch.float32)
        if args.minilm:
            minilm_accuracy(args.minilm, torch.device("cpu"), torch.float32)
        print("\n## FP8 accuracy on the CPU (fp32 activations, FP8 weights emulated)")
        print("| part | measure | fp32 | fp8 | comparison |")
        print("|---|---|---:|---:|---|")
        for r in ROWS:
            print("| " + " | ".join(r) + " |")
        return 0
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    from tritonformer.client.gpu_measure import copy_bandwidth
    from tritonformer.kernels import fp8

    fp8.check_device(dev)
    bandwidth = copy_bandwidth()
    print(f"# FP8 (E4M3) linears, {name}, torch {torch.__version__}, copy bandwidth {bandwidth / 1e9:,.0f} GB/s, "
          f"row-wise _scaled_mm out dtype for fp16: {fp8.scaled_mm_dtype(dev, torch.float16)}", flush=True)
    t0 = time.perf_counter()
    if "accuracy" in parts:
        if args.smollm2:
            smollm2_accuracy(args.smollm2, dev)
        if args.minilm:
            minilm_accuracy(args.minilm, dev)
    if "crossover" in parts:
        route_crossover(dev)
    if "encoder-profile" in parts:
        encoder_profile(dev)
    if "speed" in parts:
        gemm_speed(dev)
        act_quantize_speed(dev)
        encoder_speed(dev)
        decoder_speed(dev, bandwidth)
    print(f"\n## FP8 report, {name} ({time.perf_counter() - t0:.0f} s)")
    print("| part | measure | fp16 / bf16 | fp8 | comparison |")
    print("|---|---|---:|---:|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
