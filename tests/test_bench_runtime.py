"""`bench runtime`'s Hugging Face baselines, on the CPU with a tiny two-layer BERT: each is built
from a config of its own and runs the attention its name says (SDPA: one call to torch's
scaled_dot_product_attention per layer; eager: none), and the check catches one that does not."""
from __future__ import annotations

import pytest
import torch

from tritonformer.client import bench_runtime as bench

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 128, "max_position_embeddings": 64}


def _ids():
    return torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))


def test_each_baseline_dispatches_as_named():
    models = bench.build_hf_baselines(TINY)
    assert set(models) == set(bench.BASELINES)
    results = bench.verify_dispatch(models, _ids())
    assert results["hf_sdpa"]["config"] == "sdpa" and results["hf_sdpa"]["sdpa_calls"] == TINY["num_hidden_layers"]
    assert results["hf_eager"]["config"] == "eager" and results["hf_eager"]["sdpa_calls"] == 0
    assert all(r["ok"] and not r["shares_config_with"] for r in results.values())
    # Same weights: the two implementations compute the same hidden states.
    with torch.inference_mode():
        sdpa, eager = (models[n](input_ids=_ids()).last_hidden_state for n in ("hf_sdpa", "hf_eager"))
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-5)


def test_dispatch_check_catches_a_baseline_that_runs_another_attention():
    models = bench.build_hf_baselines(TINY)
    models["hf_sdpa"].config._attn_implementation = "eager"  # what a shared config did to it
    with pytest.raises(RuntimeError, match="hf_sdpa"):
        bench.verify_dispatch(models, _ids())

    models = bench.build_hf_baselines(TINY)
    models["hf_eager"].config = models["hf_sdpa"].config  # one config object for both
    with pytest.raises(RuntimeError, match="shared"):
        bench.verify_dispatch(models, _ids())


def test_compile_mode_follows_the_cuda_graph_rule_unless_named():
    assert bench.compile_mode_for("auto", graph_fits=True) == "reduce-overhead"
    assert bench.compile_mode_for("auto", graph_fits=False) == "default"
    assert bench.compile_mode_for("max-autotune-no-cudagraphs", graph_fits=True) == "max-autotune-no-cudagraphs"


def test_table_prints_na_with_the_reason_when_compilation_failed(capsys):
    dispatch = bench.verify_dispatch(bench.build_hf_baselines(TINY), _ids())
    meta = {"gpu": "cpu", "date": "2026-01-01T00:00:00+00:00", "command": bench.command_line(), "git_commit": None,
            "torch": torch.__version__, "transformers": "x", "layers": 2, "compile_mode": "auto",
            "bf16_peak_tflops": 1.0, "min_cosine_vs_hf": 1.0, "attention_dispatch": dispatch}
    failed = {"ms": None, "mode": "default", "dynamic": False, "error": "BackendCompilerFailed: boom"}
    rows = [
        {"shape": "(1,32)", "hf_eager_ms": 2.0, "hf_sdpa_ms": 2.0, "hf_sdpa_compiled_ms": 1.0, "ours_ms": 0.5,
         "ours_no_graph_ms": 1.5, "vs_eager": 4.0, "vs_sdpa": 4.0, "vs_compiled": 2.0, "ours_pct_peak": 1.0,
         "compiled": {"mode": "reduce-overhead", "graph_breaks": 0, "graphs_compiled": 1, "error": None}},
        {"shape": "(64,512)", "hf_eager_ms": 30.0, "hf_sdpa_ms": 16.0, "hf_sdpa_compiled_ms": None, "ours_ms": 15.0,
         "ours_no_graph_ms": 15.0, "vs_eager": 2.0, "vs_sdpa": 1.07, "vs_compiled": None, "ours_pct_peak": 50.0,
         "compiled": failed},
        {"shape": "256 req U[5,500] hf_sdpa_sorted32", "ms": 100.0, "req_per_s": 2560.0, "peak_activation_MiB": 1.0},
        {"shape": "256 req U[5,500] ours_sorted32", "ms": 50.0, "req_per_s": 5120.0, "peak_activation_MiB": 1.0},
        {"shape": "256 req U[5,500] hf_sdpa_compiled_sorted32", "ms": None, "compiled": dict(failed, dynamic=True)},
    ]
    bench.print_table(meta, rows)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.split()[:1] == ["(64,512)"])  # the table row
    assert "n/a" in line
    assert "BackendCompilerFailed: boom" in out


def test_modernbert_baseline_dispatches_sdpa_and_ours_matches_it():
    """`--model modernbert-base`'s baseline (two layers here, on the CPU): one SDPA call per
    layer, local layers included, and ours built from its weights through the family table
    computes the same hidden states. (A 2,048-token vocabulary: initialising the real one's
    embeddings takes seconds.)"""
    shrunk = {"vocab_size": 2048, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
              "sep_token_id": 2}
    hf, config = bench.build_family_baseline("modernbert-base", layers=2, overrides=shrunk)
    assert config["num_hidden_layers"] == 2 and hf.config.layer_types == ["full_attention", "sliding_attention"]
    results = bench.verify_dispatch({"hf_sdpa": hf}, _ids())
    assert results["hf_sdpa"]["ok"] and results["hf_sdpa"]["sdpa_calls"] == 2
    ours = bench.build_ours("modernbert-base", hf, torch.device("cpu"), torch.float32)
    ids = torch.randint(3, 2048, (2, 150), generator=torch.Generator().manual_seed(1))  # past the 128 window
    cu = torch.tensor([0, 150, 300], dtype=torch.int32)
    with torch.inference_mode():
        ref = hf(input_ids=ids).last_hidden_state
    assert bench._min_cosine(ours.forward(ids.reshape(-1), cu, 150), ref) >= 0.999
    # the fp16 baseline keeps its rotary frequencies in fp32 (`.to` alone would round them)
    half = bench.to_half_keeping_rotary_fp32(hf, torch.device("cpu"))
    assert next(half.parameters()).dtype == torch.float16
    buffers = dict(half.named_buffers())
    assert buffers and all(b.dtype == torch.float32 for n, b in buffers.items() if n.endswith("inv_freq"))


def test_family_table_prints_targets_and_misses(capsys):
    meta = {"gpu": "cpu", "date": "2026-01-01T00:00:00+00:00", "command": bench.command_line(), "git_commit": None,
            "torch": torch.__version__, "transformers": "x", "model": "modernbert-base", "layers": 22,
            "compile_mode": "auto",
            "attention_dispatch": {"hf_sdpa": {"config": "sdpa", "sdpa_calls": 22, "ok": True}}}
    ok = {"mode": "default", "graph_breaks": 0, "graphs_compiled": 1, "error": None}
    rows = [
        {"shape": "(1,32)", "hf_sdpa_ms": 10.0, "hf_sdpa_compiled_ms": 4.0, "ours_ms": 1.0, "ours_no_graph_ms": 3.0,
         "vs_sdpa": 10.0, "vs_compiled": 4.0, "target_vs_sdpa": 5.0, "min_cosine_vs_hf_sdpa": 0.9999,
         "compiled": ok, "peak_memory_GiB": 1.0},
        {"shape": "(8,8192)", "hf_sdpa_ms": 100.0, "hf_sdpa_compiled_ms": None, "ours_ms": 90.0,
         "ours_no_graph_ms": 90.0, "vs_sdpa": 100 / 90, "vs_compiled": None, "target_vs_sdpa": 1.2,
         "min_cosine_vs_hf_sdpa": 0.9995, "compiled": {"ms": None, "error": "OutOfMemoryError: boom"},
         "peak_memory_GiB": 20.0},
    ]
    bench.print_family_table(meta, rows)
    lines = capsys.readouterr().out.splitlines()
    short = next(line for line in lines if line.split()[:1] == ["(1,32)"])
    long = next(line for line in lines if line.split()[:1] == ["(8,8192)"])
    assert "yes" in short.split() and "NO" in long.split() and "n/a" in long.split()
    assert any("OutOfMemoryError: boom" in line for line in lines)


def test_shapes_parse_up_to_8192():
    assert bench.parse_shapes("8x8192,1x32") == [(8, 8192), (1, 32)]
    with pytest.raises(Exception):
        bench.parse_shapes("1x9000")


def test_qwen3_embedding_baseline_dispatches_sdpa_and_ours_matches_it():
    """`--model qwen3-embedding-0.6b`: a decoder family as the embedder against HF's Qwen3Model
    (two layers, a shrunk vocabulary, on the CPU): one SDPA call per layer, and ours (causal
    attention over the packed batch) computes the same hidden states for every row."""
    hf, config = bench.build_family_baseline("qwen3-embedding-0.6b", layers=2, overrides={"vocab_size": 2048})
    results = bench.verify_dispatch({"hf_sdpa": hf}, _ids())
    assert results["hf_sdpa"]["ok"] and results["hf_sdpa"]["sdpa_calls"] == 2
    ours = bench.build_ours("qwen3-embedding-0.6b", hf, torch.device("cpu"), torch.float32)
    ids = torch.randint(3, 2048, (2, 40), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 40, 80], dtype=torch.int32)
    with torch.inference_mode():
        ref = hf(input_ids=ids).last_hidden_state
    assert bench._min_cosine(ours.forward(ids.reshape(-1), cu, 40), ref) >= 0.999


@pytest.mark.parametrize("name", ["mpnet-base", "deberta-v3-base"])
def test_eager_only_family_baseline_dispatches_eager_and_ours_matches_it(name):
    """`--model mpnet-base` / `deberta-v3-base`: Hugging Face has no SDPA path for these classes,
    so the baseline is HF eager, named so (`hf_eager`), and the check sees it run eager (config
    "eager", no SDPA call); ours built from its weights computes the same hidden states (two
    layers, a 2,048-token vocabulary, on the CPU; 150 tokens: past the 128 exact distances)."""
    assert bench.family_baseline_name(name) == "hf_eager"
    hf, config = bench.build_family_baseline(name, layers=2, overrides={"vocab_size": 2048})
    assert config["num_hidden_layers"] == 2
    results = bench.verify_dispatch({"hf_eager": hf}, _ids())
    assert results["hf_eager"]["ok"] and results["hf_eager"]["config"] == "eager"
    assert results["hf_eager"]["sdpa_calls"] == 0
    with pytest.raises(RuntimeError, match="hf_sdpa"):  # under the SDPA name the same model is caught
        bench.verify_dispatch({"hf_sdpa": hf}, _ids())
    ours = bench.build_ours(name, hf, torch.device("cpu"), torch.float32)
    ids = torch.randint(3, 2048, (2, 150), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 150, 300], dtype=torch.int32)
    with torch.inference_mode():
        ref = hf(input_ids=ids).last_hidden_state
    assert bench._min_cosine(ours.forward(ids.reshape(-1), cu, 150), ref) >= 0.999


def test_eager_family_table_names_the_eager_baseline(capsys):
    meta = {"gpu": "cpu", "date": "2026-01-01T00:00:00+00:00", "command": bench.command_line(), "git_commit": None,
            "torch": torch.__version__, "transformers": "x", "model": "deberta-v3-base", "layers": 12,
            "compile_mode": "auto", "baseline": "hf_eager",
            "attention_dispatch": {"hf_eager": {"config": "eager", "sdpa_calls": 0, "ok": True}}}
    rows = [{"shape": "(1,32)", "hf_eager_ms": 10.0, "hf_eager_compiled_ms": 4.0, "ours_ms": 1.0,
             "ours_no_graph_ms": 3.0, "vs_eager": 10.0, "vs_compiled": 4.0, "target_vs_eager": None,
             "min_cosine_vs_hf_eager": 0.9999, "compiled": {"mode": "default", "error": None}, "peak_memory_GiB": 1.0}]
    bench.print_family_table(meta, rows)
    out = capsys.readouterr().out
    assert "HF eager ms" in out and "vs eager" in out and "SDPA ms" not in out
    assert "10.00x" in next(line for line in out.splitlines() if line.split()[:1] == ["(1,32)"])
