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
