"""`tritonformer serve --reranker-checkpoint / --classifier-checkpoint`: the flags name the
checkpoint through the environment variables the models read (the served path is checked in
test_integration_reranker_classifier.py, which starts a server with the variable set)."""
from __future__ import annotations

import argparse
import os

from tritonformer.client.serve import CHECKPOINT_ENVS, add_serve_arguments, run_serve


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_flag_must_name_a_checkpoint_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITONFORMER_RERANKER_CHECKPOINT", raising=False)
    assert run_serve(_args("--reranker-checkpoint", str(tmp_path), "--no-prepare")) == 2
    assert "no config.json" in capsys.readouterr().err
    assert "TRITONFORMER_RERANKER_CHECKPOINT" not in os.environ


def test_flags_default_to_none():
    args = _args()
    assert args.reranker_checkpoint is None and args.classifier_checkpoint is None
    assert args.reranker_score_tokens is None
    assert CHECKPOINT_ENVS == {"reranker": "TRITONFORMER_RERANKER_CHECKPOINT",
                               "classifier": "TRITONFORMER_CLASSIFIER_CHECKPOINT"}


def test_score_tokens_flag_reaches_the_reranker_with_the_environments_checkpoint(monkeypatch):
    """--reranker-score-tokens sets the variable the reranker reads, only for the checkpoint the
    environment names (an explicit `checkpoint` parameter keeps its own score_tokens)."""
    from tritonformer.backend.encoder.build import RERANKER_SCORE_TOKENS_ENV, reranker_score_tokens
    from tritonformer.client.serve import SCORE_TOKENS_ENV

    assert _args("--reranker-score-tokens", "no,yes").reranker_score_tokens == "no,yes"
    assert SCORE_TOKENS_ENV == RERANKER_SCORE_TOKENS_ENV
    monkeypatch.setenv(SCORE_TOKENS_ENV, " no,yes ")
    assert reranker_score_tokens("", "") == "no,yes"
    assert reranker_score_tokens("", "/some/checkpoint") == ""
    assert reranker_score_tokens("a,b", "") == "a,b"
    monkeypatch.delenv(SCORE_TOKENS_ENV)
    assert reranker_score_tokens("", "") == ""
