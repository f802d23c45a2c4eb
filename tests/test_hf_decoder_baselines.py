"""CPU smoke test of the decoder benchmark's Hugging Face baselines (tiny random GPT-2)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tritonformer.client import hf_decoder_baselines as b  # noqa: E402
from tritonformer.client.hf_reference import random_gpt2  # noqa: E402
from tritonformer.client.traces import orca_trace  # noqa: E402

VOCAB = 1000


@pytest.fixture(scope="module")
def tiny_gpt2():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: extra threads only add contention and timing noise
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=128,
                                  bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    yield random_gpt2("cpu", torch.float32, config=cfg)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_trace():
    return orca_trace(6, seed=1, prompt_range=(4, 20), output_range=(1, 9), vocab_size=VOCAB)


def test_request_level_counts_useful_tokens(tiny_gpt2, tiny_trace):
    out = b.request_level(tiny_gpt2, tiny_trace, batch_size=4, device="cpu")
    useful = sum(r.max_new_tokens for r in tiny_trace)
    assert out["useful_tokens"] == useful
    # padded execution: each batch runs to its longest member
    batches = [tiny_trace[:4], tiny_trace[4:]]
    assert out["generated_tokens"] == sum(len(bt) * max(r.max_new_tokens for r in bt) for bt in batches)
    assert out["seconds"] > 0 and out["tok_per_s"] == pytest.approx(useful / out["seconds"])


def test_hf_continuous_batching_runs(tiny_gpt2, tiny_trace):
    if not hasattr(tiny_gpt2, "init_continuous_batching"):
        with pytest.raises(RuntimeError, match="continuous batching"):
            b.hf_continuous_batching(tiny_gpt2, tiny_trace, device="cpu")
        pytest.skip(f"transformers {transformers.__version__} has no continuous batching API")
    attn_before = tiny_gpt2.config._attn_implementation
    out = b.hf_continuous_batching(tiny_gpt2, tiny_trace, device="cpu", max_batch_tokens=64,
                                   num_blocks=16)  # 16 blocks x 256 tokens; not sized from free RAM
    useful = sum(r.max_new_tokens for r in tiny_trace)
    # per-request budgets: every request generated exactly its own max_new_tokens
    assert out["useful_tokens"] == useful and out["generated_tokens"] == useful
    assert out["seconds"] > 0 and out["tok_per_s"] > 0
    assert tiny_gpt2.config._attn_implementation == attn_before  # manager restored the model


def test_hf_step_time_positive(tiny_gpt2):
    ms = b.hf_step_time(tiny_gpt2, batch_size=2, context_len=16, steps=16, device="cpu")
    assert isinstance(ms, float) and ms > 0
