"""`tritonformer bench runtime`: our encoder runtime vs Hugging Face on one GPU.

`--model bert-base` (the default) is described below. The other `--model`s (FAMILY_MODELS:
modernbert-base, xlm-roberta-large, the encoder of bge-reranker-v2-m3, qwen3-embedding-0.6b,
distilbert-base, electra-base-discriminator) time ours against HF SDPA and HF SDPA under
`torch.compile` at (1,32), (64,512) and, for ModernBERT and Qwen3, (8,8192), and print each ratio
beside its target (TARGETS); see `run_family`. mpnet-base (all-mpnet-base-v2's encoder),
deberta-v3-base and deberta-v3-large have no SDPA path in Hugging Face (their classes run eager
attention only): their baseline is HF eager and HF eager under `torch.compile`, named so in the
table and the JSON (`hf_eager_ms`, `hf_eager_compiled_ms`, `vs_eager`), at (1,32), (64,512) and,
for DeBERTa, (8,2048).

One run, same random bert-base weights, fp16: HF eager, HF SDPA, HF SDPA under `torch.compile`
and ours (packed, Triton kernels) on a fixed grid of (batch, sequence length) and on a
variable-length workload of 256 requests (lengths uniform in [5, 500], numpy seed 0). Prints
milliseconds, speed-ups and the share of the bf16 matmul peak measured in the same run, with the
GPU's name, the date, the command and the commit.

Each Hugging Face baseline is built from a config object of its own: transformers reads the
attention implementation from the config at every forward, so two models sharing one config
both run whichever implementation was set last. Before anything is timed, `verify_dispatch`
checks that every baseline runs what its name says (its config, and the calls to torch's
scaled_dot_product_attention counted during one forward).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

from tritonformer.client.encoder_inputs import packed_batch

GRID = [(1, 32), (1, 128), (1, 512), (8, 128), (32, 128), (64, 128), (64, 512)]
# Hugging Face baselines by name: the attention implementation each one must run.
BASELINES = {"hf_sdpa": "sdpa", "hf_eager": "eager"}
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "off")
# `--compile-mode auto`, per grid point: "reduce-overhead" (CUDA graphs) where ours replays a
# CUDA graph too (up to 8192 tokens), the shapes where a bert-base forward is launch-bound and
# graphs pay; "default" above, where a forward is milliseconds of GEMMs and a replay would save
# only launch gaps of microseconds while its memory pool holds another copy of the activations.
# Not "max-autotune": its GEMM autotuning adds minutes of compilation per shape to a
# one-command benchmark, and these fp16 GEMMs already run on cuBLAS, which Inductor's GEMM
# templates rarely beat at bert-base shapes (opt in with --compile-mode max-autotune-no-cudagraphs).
# The variable-length workload compiles once with dynamic shapes ("default" under auto): eight
# batch shapes would otherwise mean eight compilations.


# The encoders `--model` names besides bert-base, as their published config.json files give them
# (random weights: the timings depend on shapes only). ModernBERT-base: answerdotai/ModernBERT-base.
MODERNBERT_BASE = {
    "model_type": "modernbert", "vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22,
    "num_attention_heads": 12, "intermediate_size": 1152, "hidden_activation": "gelu",
    "max_position_embeddings": 8192, "norm_eps": 1e-05, "norm_bias": False, "global_attn_every_n_layers": 3,
    "local_attention": 128, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "attention_bias": False,
    "mlp_bias": False, "pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282,
    "cls_token_id": 50281, "sep_token_id": 50282,
}
# The XLM-RoBERTa-large encoder of BAAI/bge-reranker-v2-m3 (and bge-m3): 8,192 positions.
XLM_ROBERTA_LARGE = {
    "model_type": "xlm-roberta", "vocab_size": 250002, "hidden_size": 1024, "num_hidden_layers": 24,
    "num_attention_heads": 16, "intermediate_size": 4096, "hidden_act": "gelu", "max_position_embeddings": 8194,
    "type_vocab_size": 1, "layer_norm_eps": 1e-05, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
}
# distilbert-base-uncased (and its fine-tunes: distilbert-base-uncased-finetuned-sst-2-english, the
# sentence-transformers msmarco-distilbert models), in DistilBERT's own key names.
DISTILBERT_BASE = {
    "model_type": "distilbert", "vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
    "activation": "gelu", "max_position_embeddings": 512, "sinusoidal_pos_embds": False, "pad_token_id": 0,
}
# google/electra-base-discriminator (cross-encoder/ms-marco-electra-base's encoder): embeddings as wide as the layers.
ELECTRA_BASE_DISCRIMINATOR = {
    "model_type": "electra", "vocab_size": 30522, "embedding_size": 768, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
    "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
}
# microsoft/mpnet-base (sentence-transformers/all-mpnet-base-v2's encoder): 512 tokens after the offset of 2.
# Hugging Face runs MPNet with eager attention only: FAMILY_MODELS times it against HF eager.
MPNET_BASE = {
    "model_type": "mpnet", "vocab_size": 30527, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 514, "layer_norm_eps": 1e-05,
    "relative_attention_num_buckets": 32, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
}
# microsoft/deberta-v3-base and -large (NLI zero-shot classifiers, prompt-injection detectors and
# cross-encoder rerankers are fine-tuned from them): 256 log buckets over 512 relative positions, no
# absolute positions, no token types (also the GPU tests' shapes, tests/test_deberta_v2.py).
# Hugging Face's DeBERTa-v2 has no SDPA attention: FAMILY_MODELS times it against HF eager.
DEBERTA_V3_BASE = {
    "model_type": "deberta-v2", "vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
    "relative_attention": True, "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
    "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7, "max_relative_positions": -1, "position_biased_input": False,
    "type_vocab_size": 0, "pad_token_id": 0,
}
DEBERTA_V3_LARGE = dict(DEBERTA_V3_BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=4096)
# Qwen/Qwen3-Embedding-0.6B: a decoder family as the embedder (backend/models/decoder_encoder.py:
# causal attention over the packed batch), against HF's Qwen3Model.
QWEN3_EMBEDDING_0_6B = {
    "model_type": "qwen3", "vocab_size": 151669, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768, "attention_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151643,
}
# --model -> (config, Hugging Face class name, grid of (batch, seq), longest sequence, the
# baseline's attention). The attention is a BASELINES value: "sdpa", or "eager" for a class
# without an SDPA path (MPNet, DeBERTa-v2), where HF eager (and eager under torch.compile) is the
# strongest baseline a user has. DeBERTa has no position table (its relative buckets saturate),
# so it runs past 512 tokens: (8,2048) is in its grid. HF eager holds a few [batch*heads, seq,
# seq] tensors per layer there (scores, the int64 c2p/p2c gather indices), about 15 GB for
# -large: it fits one GPU.
FAMILY_MODELS = {
    "modernbert-base": (MODERNBERT_BASE, "ModernBertModel", [(1, 32), (64, 512), (8, 8192)], 8192, "sdpa"),
    "xlm-roberta-large": (XLM_ROBERTA_LARGE, "XLMRobertaModel", [(1, 32), (64, 512)], 8192, "sdpa"),
    "qwen3-embedding-0.6b": (QWEN3_EMBEDDING_0_6B, "Qwen3Model", [(1, 32), (64, 512), (8, 8192)], 8192, "sdpa"),
    "distilbert-base": (DISTILBERT_BASE, "DistilBertModel", [(1, 32), (64, 512)], 512, "sdpa"),
    "electra-base-discriminator": (ELECTRA_BASE_DISCRIMINATOR, "ElectraModel", [(1, 32), (64, 512)], 512, "sdpa"),
    "mpnet-base": (MPNET_BASE, "MPNetModel", [(1, 32), (64, 512)], 512, "eager"),
    "deberta-v3-base": (DEBERTA_V3_BASE, "DebertaV2Model", [(1, 32), (64, 512), (8, 2048)], 8192, "eager"),
    "deberta-v3-large": (DEBERTA_V3_LARGE, "DebertaV2Model", [(1, 32), (64, 512), (8, 2048)], 8192, "eager"),
}
MODELS = ("bert-base", *FAMILY_MODELS)
# The targets set for these encoders: ours vs HF SDPA measured in the same run, by the point's
# sequence length (none is set against an eager baseline: those rows show no target).
TARGETS = {32: 5.0, 512: 1.3, 8192: 1.2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=MODELS, default="bert-base",
                        help="bert-base: its grid, a variable-length workload and the arena; "
                             "modernbert-base, xlm-roberta-large (bge-reranker-v2-m3's encoder), "
                             "qwen3-embedding-0.6b (a decoder as the embedder), distilbert-base, "
                             "electra-base-discriminator: ours vs HF SDPA (+ torch.compile) at (1,32), (64,512) "
                             "and, for ModernBERT and Qwen3, (8,8192); mpnet-base, deberta-v3-base, "
                             "deberta-v3-large (no SDPA in HF): ours vs HF eager (+ torch.compile) at (1,32), "
                             "(64,512) and, for DeBERTa, (8,2048)")
    parser.add_argument("--iters", type=int, default=30, help="timed repetitions per point (median reported)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--layers", type=int, default=None,
                        help="encoder layers (default: the model's own; bert-base: 12)")
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help="grid points as BATCHxSEQ,... (default for bert-base: "
                             + ",".join(f"{b}x{s}" for b, s in GRID) + "; for the others: their FAMILY_MODELS grid)")
    parser.add_argument(
        "--compile-mode", choices=COMPILE_MODES, default="auto",
        help="torch.compile mode of the 'HF SDPA (or eager) + torch.compile' baseline: auto = reduce-overhead "
             "where ours replays a CUDA graph (<= 8192 tokens), default above; off = skip that baseline")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """`"1x32,64x512"` -> `[(1, 32), (64, 512)]`."""
    try:
        shapes = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(shape) != 2 or min(shape) < 1 or shape[1] > 8192 for shape in shapes):
        raise argparse.ArgumentTypeError(f"expected BATCHxSEQ,... with SEQ <= 8192, got {text!r}")
    return shapes


# --- the Hugging Face baselines and the check that they run what their names say ---------------


def build_hf_baselines(config: dict | None = None, seed: int = 0) -> dict:
    """`{name: transformers.BertModel}` for every entry of BASELINES, on the CPU in fp32, with
    the same random weights (drawn with `seed`). Each model is built from a config object of its
    own with its attention implementation set explicitly; `config` holds further BertConfig
    fields (e.g. `num_hidden_layers`)."""
    import torch
    import transformers

    models, state = {}, None
    for name, attn in BASELINES.items():
        cfg = transformers.BertConfig(**(config or {}), attn_implementation=attn)
        if state is None:
            torch.manual_seed(seed)
        model = transformers.BertModel._from_config(copy.deepcopy(cfg), attn_implementation=attn, add_pooling_layer=False)
        if state is None:
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        models[name] = model.eval()
    return models


def _sdpa_call_counter():
    """A torch function mode counting calls to torch.nn.functional.scaled_dot_product_attention
    however the caller reached it (a mode sees the call, where patching the attribute would miss
    a reference taken at import time)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CountSDPA(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.scaled_dot_product_attention:
                self.calls += 1
            return func(*args, **(kwargs or {}))

    return CountSDPA()


def verify_dispatch(models: dict, input_ids) -> dict:
    """Check that each Hugging Face baseline dispatches attention as its name (a BASELINES key)
    says. Call it after all baselines are built: a later build can change an earlier model
    through a shared config. For each model: the implementation its config names, whether its
    config object is its own, and the number of calls to torch's scaled_dot_product_attention
    during one forward on `input_ids` (SDPA: one per layer; eager: none). Returns
    `{name: {...,"ok": bool}}`; raises RuntimeError naming every mismatch."""
    import torch

    results, problems = {}, []
    for name, model in models.items():
        requested = BASELINES[name]
        config_attn = model.config._attn_implementation
        shares = [other for other, m in models.items() if other != name and m.config is model.config]
        counter = _sdpa_call_counter()
        with torch.inference_mode(), counter:
            model(input_ids=input_ids)
        layers = model.config.num_hidden_layers
        expected_calls = layers if requested == "sdpa" else 0
        ok = config_attn == requested and not shares and counter.calls == expected_calls
        results[name] = {"requested": requested, "config": config_attn, "sdpa_calls": counter.calls,
                         "expected_sdpa_calls": expected_calls, "shares_config_with": shares, "ok": ok}
        if not ok:
            problems.append(f"{name} (requested {requested}): config says {config_attn!r}, "
                            f"{counter.calls} SDPA calls in one {layers}-layer forward (expected {expected_calls})"
                            + (f", config shared with {shares}" if shares else ""))
    if problems:
        raise RuntimeError("a baseline does not run what its name says: " + "; ".join(problems))
    return results


def format_dispatch(results: dict) -> str:
    return "; ".join(f"{name}: config {r['config']}, {r['sdpa_calls']} SDPA calls in one forward"
                     f" ({'ok' if r['ok'] else 'WRONG'})" for name, r in results.items())


def compile_mode_for(requested: str, graph_fits: bool) -> str:
    """The torch.compile mode of the compiled baseline at one grid point (see the comment on
    COMPILE_MODES): `graph_fits` says whether ours replays a CUDA graph at that point."""
    if requested != "auto":
        return requested
    return "reduce-overhead" if graph_fits else "default"


def compile_and_warm(model, calls: list[dict], mode: str, dynamic: bool):
    """A fresh `torch.compile(model)` (the compiled code of earlier shapes dropped first), run
    untimed over `calls` (forward kwargs) until it is compiled and, in a CUDA-graph mode,
    recorded. Returns `(run_all, compiled, info)`: `run_all()` runs every call once and returns
    the last output; `info` holds the mode, the compile seconds, the graph breaks and the number
    of graphs Dynamo compiled (1 = the whole forward as one graph) and, in a CUDA-graph mode,
    how often Inductor skipped CUDA graphs."""
    import torch
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    breaks = sum(counters["graph_break"].values())
    graphs = counters["stats"]["unique_graphs"]
    skips = counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(model, mode=mode, dynamic=dynamic)
    cudagraphs = mode in ("reduce-overhead", "max-autotune")

    def run_all():
        out = None
        for kwargs in calls:
            if cudagraphs:  # each forward is a new step: earlier outputs may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            out = compiled(**kwargs)
        return out

    start = time.perf_counter()
    run_all()
    _sync()
    compile_s = time.perf_counter() - start
    for _ in range(2):  # CUDA-graph trees warm up, then record, then replay
        run_all()
    _sync()
    info = {"mode": mode, "dynamic": dynamic, "compile_s": compile_s,
            "graph_breaks": sum(counters["graph_break"].values()) - breaks,
            "graphs_compiled": counters["stats"]["unique_graphs"] - graphs}
    if cudagraphs:  # Inductor falls back to launching kernels when it cannot use a graph
        info["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
    return run_all, compiled, info


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _error_reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- provenance ---------------------------------------------------------------------------------


def command_line() -> str:
    """The command that started this process, as a user would type it."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:  # python -m tritonformer.client.cli ...
        name = spec.name.removesuffix(".__main__")
        return shlex.join([os.path.basename(sys.executable), "-m", name, *sys.argv[1:]])
    return shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]])


def git_commit() -> str | None:
    """The short commit of the checkout this module runs from, or None (no git, no checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


# --- timing and workloads -----------------------------------------------------------------------


def _time_ms(fn, iters: int, warmup: int = 5) -> float:
    from tritonformer.client.gpu_measure import cuda_ms

    return cuda_ms(fn, iters, warmup)


def measure_bf16_peak_tflops(n: int = 8192) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b, iters=20)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def bert_flops(lengths: list[int], hidden: int, layers: int, intermediate: int) -> float:
    """Matmul FLOPs of an encoder forward: QKV, output, FFN GEMMs, plus QK^T and PV."""
    tokens = sum(lengths)
    gemm = 2 * tokens * (4 * hidden * hidden + 2 * hidden * intermediate)
    attention = sum(2 * 2 * n * n * hidden for n in lengths)
    return layers * (gemm + attention)


def _min_cosine(got, ref) -> float:
    import torch

    h = ref.shape[-1]
    return torch.nn.functional.cosine_similarity(got.reshape(-1, h).float(), ref.reshape(-1, h).float(), dim=-1).min().item()


def _time_compiled(model, calls: list[dict], mode: str, dynamic: bool, iters: int, reference,
                   baseline: str = "hf_sdpa") -> dict:
    """Compile, warm up (untimed), check against `reference` (the uncompiled output of the last
    call, `baseline` names that model), then time one pass over `calls`. On any failure:
    `{"ms": None, "error": reason}`."""
    if mode == "off":
        return {"ms": None, "error": "--compile-mode off"}
    try:
        run_all, _, info = compile_and_warm(model, calls, mode, dynamic)
        info[f"min_cosine_vs_{baseline}"] = _min_cosine(run_all().last_hidden_state, reference)
        before = _graphs_compiled()
        info["ms"] = _time_ms(run_all, iters)
        info["recompiled_while_timed"] = _graphs_compiled() != before
        info["error"] = None
        return info
    except Exception as e:  # a baseline that cannot compile is reported, not fatal
        return {"ms": None, "mode": mode, "dynamic": dynamic, "error": _error_reason(e)}
    finally:
        import torch

        torch.compiler.reset()  # frees the compiled code and its CUDA-graph pools


def family_baseline_name(name: str) -> str:
    """The BASELINES key of a FAMILY_MODELS entry's Hugging Face baseline: "hf_sdpa", or
    "hf_eager" for a class without an SDPA path."""
    attn = FAMILY_MODELS[name][4]
    return next(key for key, value in BASELINES.items() if value == attn)


def build_family_baseline(name: str, layers: int | None = None, seed: int = 0, overrides: dict | None = None):
    """(Hugging Face model with the entry's attention, SDPA or eager, its config dict) for a
    FAMILY_MODELS entry, on the CPU in fp32 with random weights drawn with `seed`; `layers`
    overrides the depth and `overrides` other config fields (tests shrink the vocabulary)."""
    import torch
    import transformers

    config, class_name, _, _, attn = FAMILY_MODELS[name]
    config = dict(config, **({"num_hidden_layers": layers} if layers else {}), **(overrides or {}))
    cls = getattr(transformers, class_name)
    hf_config = cls.config_class(**{k: v for k, v in config.items() if k != "model_type"}, attn_implementation=attn)
    torch.manual_seed(seed)
    kwargs = {"add_pooling_layer": False} if class_name in ("XLMRobertaModel", "MPNetModel") else {}
    model = cls._from_config(hf_config, attn_implementation=attn, **kwargs)
    return model.eval(), config


def to_half_keeping_rotary_fp32(model, device):
    """`model.to(device, fp16)`, except its rotary inverse frequencies: `.to` casts every float
    buffer, and an fp16 inv_freq puts far positions off by whole radians (HF computes its cos/sin
    in fp32 from whatever the buffer holds). Loading with `dtype=` keeps them fp32; this does the
    same for a model built in fp32."""
    import torch

    kept = {name: buf.clone() for name, buf in model.named_buffers() if name.endswith("inv_freq")}
    model = model.to(device, torch.float16)
    for name, buf in kept.items():
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, buf.to(device))
    return model


def build_ours(name: str, hf_model, device, dtype):
    """Our encoder for a FAMILY_MODELS entry, on the Hugging Face baseline's weights, through the
    family table the served models use."""
    from tritonformer.backend.checkpoints.weights import strip_prefixes_of
    from tritonformer.backend.models.encoder import load_encoder

    state = strip_prefixes_of(dict(hf_model.state_dict()))
    return load_encoder(hf_model.config.to_dict(), state, device, dtype)


def run_family(args) -> int:
    """A FAMILY_MODELS encoder (`--model`: ModernBERT-base, XLM-R-large, DistilBERT, ELECTRA, ...):
    for each point, the HF baseline (SDPA, or eager for MPNet and DeBERTa, which have no SDPA
    path; `family_baseline_name`) uncompiled, the same baseline compiled for that shape (warm-up
    untimed) and ours (packed, Triton kernels, the activation arena; a CUDA-graph replay where a
    bucket fits), all fp16 on the same random weights, in one run; the baseline's attention
    dispatch is checked first (SDPA: one SDPA call per layer; eager: none)."""
    import torch
    import transformers

    from tritonformer.backend.cuda_graphs import EncoderGraphs
    from tritonformer.backend.encoder.activation_arena import ActivationArena

    dev = torch.device("cuda")
    _, _, grid, longest, attn = FAMILY_MODELS[args.model]
    base = family_baseline_name(args.model)  # "hf_sdpa" or "hf_eager": every key and label says which
    shapes = args.shapes or grid
    if any(s > longest for _, s in shapes):
        print(f"bench runtime: {args.model} reads at most {longest} tokens per sequence", file=sys.stderr)
        return 2
    hf, config = build_family_baseline(args.model, args.layers)
    hf = to_half_keeping_rotary_fp32(hf, dev)
    ours = build_ours(args.model, hf, dev, torch.float16)
    graphs, arena = EncoderGraphs(ours), ActivationArena(dev)
    meta = {"gpu": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command_line(), "git_commit": git_commit(), "torch": torch.__version__,
            "transformers": transformers.__version__, "model": args.model, "layers": hf.config.num_hidden_layers,
            "dtype": "float16", "compile_mode": args.compile_mode, "iters": args.iters, "baseline": base}
    try:
        meta["attention_dispatch"] = verify_dispatch({base: hf}, torch.randint(1000, 20000, (2, 16), device=dev))
    except RuntimeError as e:
        print(f"bench runtime: {e}", file=sys.stderr)
        return 1
    print(f"attention dispatch: {format_dispatch(meta['attention_dispatch'])}", file=sys.stderr)
    rows = []
    with torch.inference_mode():
        for b, s in shapes:
            torch.cuda.reset_peak_memory_stats()
            ids = torch.randint(1000, 20000, (b, s), device=dev)
            flat, cu = ids.reshape(-1), torch.arange(0, b * s + 1, s, device=dev, dtype=torch.int32)
            reference = hf(input_ids=ids).last_hidden_state
            cosine = _min_cosine(ours.forward(flat, cu, s, arena=arena), reference)
            t_hf = _time_ms(lambda: hf(input_ids=ids), args.iters)
            t_ours = t_ours_eager = _time_ms(lambda: ours.forward(flat, cu, s, arena=arena), args.iters)
            graph_fits = graphs.bucket(b * s, b) is not None
            if graph_fits:
                t_ours = min(t_ours, _time_ms(lambda: graphs.forward(flat, [s] * b), args.iters))
            mode = compile_mode_for(args.compile_mode, graph_fits)
            comp = _time_compiled(hf, [{"input_ids": ids}], mode, False, args.iters, reference, base)
            t_comp = comp.pop("ms")
            done = f"{t_comp:.3f} ms, compiled in {comp['compile_s']:.0f} s" if t_comp is not None else None
            print(f"({b},{s}): compiled ({mode}): {done or 'n/a (' + comp['error'] + ')'}", file=sys.stderr)
            rows.append({"shape": f"({b},{s})", f"{base}_ms": t_hf, f"{base}_compiled_ms": t_comp, "ours_ms": t_ours,
                         "ours_no_graph_ms": t_ours_eager, f"vs_{attn}": t_hf / t_ours,
                         "vs_compiled": t_comp / t_ours if t_comp is not None else None,
                         f"target_vs_{attn}": TARGETS.get(s) if attn == "sdpa" else None,
                         f"min_cosine_vs_{base}": cosine, "compiled": comp,
                         "peak_memory_GiB": torch.cuda.max_memory_allocated() / 2**30})
            del reference
            torch.cuda.empty_cache()
    print_family_table(meta, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
    return 0


def print_family_table(meta: dict, rows: list[dict]) -> None:
    base = meta.get("baseline", "hf_sdpa")
    attn = BASELINES[base]
    label = "SDPA" if attn == "sdpa" else attn  # "HF SDPA", "HF eager"
    print(f"\nGPU: {meta['gpu']}   date: {meta['date']}   commit: {meta['git_commit'] or 'unknown'}")
    print(f"command: {meta['command']}")
    print(f"torch {meta['torch']}, transformers {meta['transformers']}; random {meta['model']} weights, "
          f"{meta['layers']} layers, fp16")
    print(f"attention dispatch (checked before timing): {format_dispatch(meta['attention_dispatch'])}")
    print("ours: packed, Triton kernels, activation arena; a CUDA-graph replay where a bucket fits (<= 8192 tokens)")
    if attn != "sdpa":
        print(f"baseline: HF {label} attention (this Hugging Face class has no SDPA path)")
    print(f"compiled: HF {label} under torch.compile, once per shape, warm-up untimed; "
          f"--compile-mode {meta['compile_mode']}")
    print("vs X: X ms / ours ms (> 1: ours faster); target: ours vs HF SDPA, as set for these encoders"
          + (" (none set vs eager)" if attn != "sdpa" else ""))
    print(f"{'shape':>10} {f'HF {label} ms':>11} {f'{label}+compile ms':>16} {'ours ms':>9} {f'vs {label}':>8}"
          f" {'target':>7} {'met':>4} {'vs compiled':>12} {'min cos':>8}   {'ours no-graph ms':>16} {'peak GiB':>9}")
    notes = []
    for r in rows:
        target = r[f"target_vs_{attn}"]
        met = "" if target is None else ("yes" if r[f"vs_{attn}"] >= target else "NO")
        print(f"{r['shape']:>10} {r[f'{base}_ms']:11.3f} {_ms(r[f'{base}_compiled_ms'], 16)} {r['ours_ms']:9.3f}"
              f" {_ratio(r[f'vs_{attn}'], 8)} {_ratio(target, 7)} {met:>4} {_ratio(r['vs_compiled'], 12)}"
              f" {r[f'min_cosine_vs_{base}']:8.5f}   {r['ours_no_graph_ms']:16.3f} {r['peak_memory_GiB']:9.1f}")
        notes += _compile_notes(r["shape"], r["compiled"])
    if notes:
        print("\ncompiled baseline notes:")
        for note in notes:
            print(f"  {note}")


def run(args) -> int:
    import numpy as np
    import torch
    import transformers

    from tritonformer.backend.cuda_graphs import EncoderGraphs
    from tritonformer.backend.encoder.activation_arena import ActivationArena
    from tritonformer.backend.models.bert import BertConfig, BertEncoder

    if not torch.cuda.is_available():
        print("bench runtime needs a CUDA GPU", file=sys.stderr)
        return 2
    if getattr(args, "model", "bert-base") != "bert-base":
        return run_family(args)
    args.layers = args.layers or 12
    if args.shapes is None:
        args.shapes = GRID
    if any(s > 512 for _, s in args.shapes):
        print("bench runtime: bert-base reads at most 512 tokens per sequence", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    meta = {"gpu": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command_line(), "git_commit": git_commit(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "layers": args.layers, "dtype": "float16", "compile_mode": args.compile_mode, "iters": args.iters}
    meta["bf16_peak_tflops"] = peak = measure_bf16_peak_tflops()

    baselines = {name: m.to(dev, torch.float16) for name, m in build_hf_baselines({"num_hidden_layers": args.layers}).items()}
    hf_sdpa, hf_eager = baselines["hf_sdpa"], baselines["hf_eager"]
    cfg = hf_sdpa.config
    ours = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf_sdpa.state_dict(), dev, torch.float16)
    graphs = EncoderGraphs(ours)
    arena = ActivationArena(dev)  # the served configuration: eager batches run in the arena
    h, L, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size

    # Every baseline is built: check each runs the attention its name says, on this GPU.
    try:
        meta["attention_dispatch"] = verify_dispatch(baselines, torch.randint(1000, 20000, (2, 16), device=dev))
    except RuntimeError as e:
        print(f"bench runtime: {e}", file=sys.stderr)
        return 1
    print(f"attention dispatch: {format_dispatch(meta['attention_dispatch'])}", file=sys.stderr)

    def packed(lengths):
        return packed_batch(lengths, dev)

    rows = []
    with torch.inference_mode():
        # Correctness first: ours vs HF SDPA on one grid point.
        ids = torch.randint(1000, 20000, (8, 128), device=dev)
        ref = hf_sdpa(input_ids=ids).last_hidden_state
        cu8 = torch.arange(0, 8 * 128 + 1, 128, device=dev, dtype=torch.int32)
        meta["min_cosine_vs_hf"] = _min_cosine(ours.forward(ids.reshape(-1), cu8, 128), ref)

        for b, s in args.shapes:
            ids = torch.randint(1000, 20000, (b, s), device=dev)
            flat, cu, mx = ids.reshape(-1), torch.arange(0, b * s + 1, s, device=dev, dtype=torch.int32), s
            t_eager = _time_ms(lambda: hf_eager(input_ids=ids), args.iters)
            t_sdpa = _time_ms(lambda: hf_sdpa(input_ids=ids), args.iters)
            t_ours = t_ours_eager = _time_ms(lambda: ours.forward(flat, cu, mx, arena=arena), args.iters)
            graph_fits = graphs.bucket(b * s, b) is not None
            if graph_fits:  # small shapes: replay a captured CUDA graph
                t_ours = min(t_ours, _time_ms(lambda: graphs.forward(flat, [s] * b), args.iters))
            # The same SDPA model compiled for this shape alone; warm-up outside the timed region.
            mode = compile_mode_for(args.compile_mode, graph_fits)
            comp = _time_compiled(hf_sdpa, [{"input_ids": ids}], mode, False, args.iters,
                                  hf_sdpa(input_ids=ids).last_hidden_state)
            t_comp = comp.pop("ms")
            done = f"{t_comp:.3f} ms, compiled in {comp['compile_s']:.0f} s" if t_comp is not None else None
            print(f"({b},{s}): compiled ({mode}): {done or 'n/a (' + comp['error'] + ')'}", file=sys.stderr)
            flops = bert_flops([s] * b, h, L, inter)
            rows.append(
                {"shape": f"({b},{s})", "hf_eager_ms": t_eager, "hf_sdpa_ms": t_sdpa, "hf_sdpa_compiled_ms": t_comp,
                 "ours_ms": t_ours, "ours_no_graph_ms": t_ours_eager,
                 "vs_eager": t_eager / t_ours, "vs_sdpa": t_sdpa / t_ours,
                 "vs_compiled": t_comp / t_ours if t_comp is not None else None, "compiled": comp,
                 "ours_pct_peak": 100 * flops / (t_ours * 1e-3) / (peak * 1e12)}
            )

        # Variable-length workload: 256 requests, lengths U[5, 500], seed 0.
        lengths = np.random.default_rng(0).integers(5, 501, 256).tolist()
        order = sorted(range(256), key=lambda i: lengths[i])
        batches = [order[i : i + 32] for i in range(0, 256, 32)]
        hf_inputs = []
        for batch in batches:
            mx = max(lengths[i] for i in batch)
            ids = torch.randint(1000, 20000, (len(batch), mx), device=dev)
            mask = torch.zeros(len(batch), mx, dtype=torch.long, device=dev)
            for row, i in enumerate(batch):
                mask[row, : lengths[i]] = 1
            hf_inputs.append((ids, mask))
        ours_sorted = [packed([lengths[i] for i in batch]) for batch in batches]
        ours_all = packed(lengths)
        hf_calls = [{"input_ids": ids, "attention_mask": mask} for ids, mask in hf_inputs]

        def run_hf():
            for kwargs in hf_calls:
                hf_sdpa(**kwargs)

        def run_ours_sorted(arena=None):
            for ids, cu, mx in ours_sorted:
                ours.forward(ids, cu, mx, arena=arena)

        arena = ActivationArena(dev)
        varlen = [("hf_sdpa_sorted32", run_hf), ("ours_sorted32", run_ours_sorted),
                  ("ours_sorted32_arena", lambda: run_ours_sorted(arena)),
                  ("ours_one_batch", lambda: ours.forward(*ours_all)),
                  ("ours_one_batch_arena", lambda: ours.forward(*ours_all, arena=arena))]
        # HF SDPA compiled once with dynamic shapes over the eight sorted batches (a static
        # compile would compile each batch shape anew); the compile and warm-up are untimed.
        varlen_mode = "default" if args.compile_mode == "auto" else args.compile_mode
        compiled_info = {"mode": varlen_mode, "dynamic": True, "error": "--compile-mode off"}
        if varlen_mode != "off":
            try:
                run_compiled, _, compiled_info = compile_and_warm(hf_sdpa, hf_calls, varlen_mode, True)
                compiled_info["min_cosine_vs_hf_sdpa"] = _min_cosine(
                    run_compiled().last_hidden_state[hf_calls[-1]["attention_mask"].bool()],
                    hf_sdpa(**hf_calls[-1]).last_hidden_state[hf_calls[-1]["attention_mask"].bool()])
                compiled_info["error"] = None
                varlen.insert(1, ("hf_sdpa_compiled_sorted32", run_compiled))
            except Exception as e:
                compiled_info = {"mode": varlen_mode, "dynamic": True, "error": _error_reason(e)}
                torch.compiler.reset()
        print(f"variable-length workload, compiled HF SDPA ({varlen_mode}, dynamic shapes): "
              + (f"compiled in {compiled_info['compile_s']:.0f} s, {compiled_info['graphs_compiled']} graph(s)"
                 if compiled_info.get("error") is None else f"n/a ({compiled_info['error']})"), file=sys.stderr)
        for name, fn in varlen:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            graphs_before = _graphs_compiled()
            try:
                ms = _time_ms(fn, max(3, args.iters // 5), warmup=2)
            except Exception as e:  # only the compiled baseline can fail here
                if name != "hf_sdpa_compiled_sorted32":
                    raise
                compiled_info["error"] = _error_reason(e)
                continue
            peak_bytes = torch.cuda.max_memory_allocated() - base
            row = {"shape": f"256 req U[5,500] {name}", "ms": ms, "req_per_s": 256 / (ms * 1e-3),
                   "peak_activation_MiB": peak_bytes / 2**20}
            if name == "hf_sdpa_compiled_sorted32":
                compiled_info["recompiled_while_timed"] = _graphs_compiled() != graphs_before
                row["compiled"] = compiled_info
            rows.append(row)
        if compiled_info.get("error") is not None:
            rows.append({"shape": "256 req U[5,500] hf_sdpa_compiled_sorted32", "ms": None, "compiled": compiled_info})
        torch.compiler.reset()

        # One 8192-token request (16 texts of 512: BERT's longest), then short ones: the arena
        # must shrink back.
        arena = ActivationArena(dev)
        ours.forward(*packed([512] * 16), arena=arena)
        after_long = arena.stats.reserved_bytes
        for _ in range(3):
            ours.forward(*packed([32, 17]), arena=arena)
        rows.append({"arena_after_8192_MiB": after_long / 2**20, "arena_after_short_MiB": arena.stats.reserved_bytes / 2**20,
                     "arena_planning_ms": 1e3 * arena.stats.planning_seconds, "arena_plan_hits": arena.stats.plan_cache_hits})

    print_table(meta, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
    return 0


def _ms(value, width: int, digits: int = 3) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'n/a':>{width}}"


def best_baseline_ms(row: dict) -> float:
    """The fastest HF baseline of a grid point (eager, SDPA, SDPA compiled where it compiled):
    a user picks whichever runs fastest for them, so the headline ratio is against that one."""
    times = [row["hf_eager_ms"], row["hf_sdpa_ms"], row.get("hf_sdpa_compiled_ms")]
    return min(t for t in times if t)


def _ratio(value, width: int) -> str:
    return f"{value:{width - 1}.2f}x" if value is not None else f"{'n/a':>{width}}"


def print_table(meta: dict, rows: list[dict]) -> None:
    print(f"\nGPU: {meta['gpu']}   date: {meta['date']}   commit: {meta['git_commit'] or 'unknown'}")
    print(f"command: {meta['command']}")
    print(f"torch {meta['torch']}, transformers {meta['transformers']}; random bert-base weights, "
          f"{meta['layers']} layers, fp16")
    print(f"measured bf16 matmul peak: {meta['bf16_peak_tflops']:.0f} TFLOP/s   "
          f"min cosine ours vs HF SDPA (8,128): {meta['min_cosine_vs_hf']:.5f}")
    print(f"attention dispatch (checked before timing): {format_dispatch(meta['attention_dispatch'])}")
    print("ours: packed, Triton kernels; a CUDA-graph replay where a small-shape bucket fits (<= 8192 tokens)")
    print(f"compiled: HF SDPA under torch.compile, once per shape, warm-up untimed; --compile-mode {meta['compile_mode']}"
          + (" (reduce-overhead where ours replays a graph, default above)" if meta["compile_mode"] == "auto" else ""))
    print("vs X: X ms / ours ms (> 1: ours faster); vs best: against the fastest of the three HF baselines")
    print(f"{'shape':>10} {'HF eager ms':>12} {'HF SDPA ms':>11} {'SDPA+compile ms':>15} {'ours ms':>9}"
          f" {'vs SDPA':>8} {'vs compiled':>12} {'vs eager':>9} {'vs best':>8} {'% peak':>7}   {'ours no-graph ms':>16}"
          f" {'compile mode':>15}")
    notes = []
    for r in rows:
        if "ours_ms" in r:
            c = r["compiled"]
            print(f"{r['shape']:>10} {r['hf_eager_ms']:12.3f} {r['hf_sdpa_ms']:11.3f} {_ms(r['hf_sdpa_compiled_ms'], 15)}"
                  f" {r['ours_ms']:9.3f} {_ratio(r['vs_sdpa'], 8)} {_ratio(r['vs_compiled'], 12)}"
                  f" {_ratio(r['vs_eager'], 9)} {_ratio(best_baseline_ms(r) / r['ours_ms'], 8)}"
                  f" {r['ours_pct_peak']:6.1f}%   {r['ours_no_graph_ms']:16.3f}"
                  f" {c.get('mode', ''):>15}")
            notes += _compile_notes(r["shape"], c)
    print(f"\n{'variable-length workload':<50} {'ms':>9} {'req/s':>9} {'peak act. MiB':>14}")
    for r in rows:
        if "req_per_s" in r:
            print(f"{r['shape']:<50} {r['ms']:9.2f} {r['req_per_s']:9.0f} {r['peak_activation_MiB']:14.1f}")
        elif r.get("shape", "").startswith("256 req") and r.get("ms") is None:
            print(f"{r['shape']:<50} {'n/a':>9} ({r['compiled']['error']})")
        if "compiled" in r and "ours_ms" not in r and r.get("ms") is not None:
            notes += _compile_notes(r["shape"].split()[-1], r["compiled"])
    hf = next(r for r in rows if r.get("shape", "").endswith(" hf_sdpa_sorted32"))
    comp = next((r for r in rows if r.get("shape", "").endswith("hf_sdpa_compiled_sorted32") and r.get("ms")), None)
    for r in rows:
        if "req_per_s" in r and r["shape"].split()[-1].startswith("ours"):
            line = f"  {r['shape'].split()[-1]} vs HF SDPA sorted batches of 32: {r['req_per_s'] / hf['req_per_s']:.2f}x"
            if comp is not None:
                line += f", vs compiled: {r['req_per_s'] / comp['req_per_s']:.2f}x"
            print(line)
    for r in rows:
        if "arena_after_8192_MiB" in r:
            print(f"\narena: {r['arena_after_8192_MiB']:.1f} MiB after one 8192-token request, "
                  f"{r['arena_after_short_MiB']:.1f} MiB after 3 short ones "
                  f"(planning {r['arena_planning_ms']:.2f} ms in all, {r['arena_plan_hits']} plan-cache hits)")
    if notes:
        print("\ncompiled baseline notes:")
        for note in notes:
            print(f"  {note}")


def _compile_notes(label: str, c: dict) -> list[str]:
    """What a reader of the compiled column must know: why a point is n/a, graph breaks,
    recompilation inside the timed region, outputs that drift from eager SDPA."""
    if c.get("error"):
        return [f"{label}: n/a, {c['error']}"]
    notes = []
    if c.get("graph_breaks"):
        notes.append(f"{label}: {c['graph_breaks']} graph break(s), {c['graphs_compiled']} graphs")
    if c.get("cudagraph_skips"):
        notes.append(f"{label}: Inductor skipped CUDA graphs {c['cudagraph_skips']} time(s) (see its warning above)")
    if c.get("recompiled_while_timed"):
        notes.append(f"{label}: recompiled inside the timed region")
    for key in (k for k in c if k.startswith("min_cosine_vs_")):  # vs the uncompiled baseline
        if c[key] < 0.999:
            notes.append(f"{label}: min cosine vs uncompiled {key.removeprefix('min_cosine_vs_')} {c[key]:.5f}")
    return notes
