"""`bench serve-encoder --in-process` on the CPU with a one-layer bert-base: the policies run
under open-loop load, and `--execution padded` costs each batch as a padded runtime would."""
from __future__ import annotations

import json

import numpy as np
import torch

from tritonformer.client import bench_serve_encoder as bench


def test_padded_engine_runs_rectangles_and_matches_packed_on_equal_lengths():
    import transformers

    from tritonformer.backend.encoder.engine import EmbedderEngine
    from tritonformer.backend.models.bert import BertConfig, BertEncoder
    from tritonformer.scheduler.fifo import FifoBatchPolicy

    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    hf = transformers.BertModel._from_config(cfg, add_pooling_layer=False).eval()
    model = BertEncoder(BertConfig.from_hf(cfg.to_dict()), hf.state_dict(), torch.device("cpu"), torch.float32)
    seen = []
    forward = model.forward
    model.forward = lambda ids, cu, *a, **kw: seen.append(cu.tolist()) or forward(ids, cu, *a, **kw)
    padded = bench.padded_cost_engine()(model, bench.LatencySink(), FifoBatchPolicy())
    packed = EmbedderEngine(model, bench.LatencySink(), FifoBatchPolicy())
    executed = bench.ExecutedTokens(model, None)  # wraps model.forward: after `seen`'s wrapper
    padded.embed([[5, 6, 7], [8], [9, 10, 11, 12, 13]])
    assert seen[-1] == [0, 5, 10, 15]  # every sequence as long as the longest
    assert executed.tokens == 15  # 9 real tokens: a padding ratio of 0.4
    same = [[5, 6, 7], [8, 9, 10]]
    np.testing.assert_allclose(padded.embed(same), packed.embed(same), rtol=1e-6, atol=1e-6)


def test_bench_runs_policies_on_padded_execution(tmp_path, monkeypatch, capsys):
    import argparse

    monkeypatch.setenv("TRITONFORMER_CACHE_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "result.json"
    args = parser.parse_args(["--in-process", "--layers", "1", "--rates", "20", "--seconds", "1",
                              "--policies", "fifo-tokens,dp", "--execution", "padded", "--json", str(out)])
    assert bench.run(args) == 0
    result = json.loads(out.read_text())
    assert result["execution"] == "padded"
    for policy in ("fifo-tokens", "dp"):
        (row,) = result["results"][policy]
        assert row["answered"] == row["sent"] > 0 and row["errors"] == 0
        assert 0.0 <= row["padding_ratio"] < 1.0 and row["decision_us_p50"] > 0
    assert "padded execution" in capsys.readouterr().out
    (table,) = (tmp_path / "cost_models").glob("encoder-*.json")  # measured for this execution mode
    assert json.loads(table.read_text())["packed"] is False  # a padded runtime's cost follows the longest
