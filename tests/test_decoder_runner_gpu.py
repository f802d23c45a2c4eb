"""The decoder runner's sampling hand-off on the GPU: which ids the next iteration is fed, and
their trip to the host through pinned buffers used in turn. Run on the GPU machine:
`pytest -m gpu`."""
from types import SimpleNamespace

import pytest
import torch

from tritonformer.backend.decoder.runner import DecoderRunner, Forward
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.decoder.sampling import Sampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda")
VOCAB = 1000


def _runner(max_running=8):
    model = SimpleNamespace(device=CUDA, config=SimpleNamespace(max_position_embeddings=64))
    return DecoderRunner(model, SimpleNamespace(block_size=16), max_running, cuda_graphs=False)


def _logits(rows, seed):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=gen, device=CUDA)


def test_an_all_greedy_iteration_takes_the_replays_own_samples():
    runner = _runner()
    logits = _logits(4, 0)
    # Not the argmax, so the test tells which path ran; the replay left them in last_ids.
    replay_ids = (logits.argmax(-1) + 1) % VOCAB
    runner.last_ids[:4].copy_(replay_ids)
    tokens = runner.sample(Forward(logits, replay_ids), Sampler(), [SamplingParams()] * 3, [0, 1, 2]).wait()
    assert tokens == replay_ids[:3].tolist()


def test_a_sampled_row_sends_the_whole_iteration_through_the_sampler():
    runner = _runner()
    logits = _logits(4, 1)
    argmax = logits.argmax(-1).tolist()
    replay_ids = (logits.argmax(-1) + 1) % VOCAB
    runner.last_ids[:4].copy_(replay_ids)
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=5), SamplingParams()]
    tokens = runner.sample(Forward(logits, replay_ids), Sampler(), params, [0, 1, 2]).wait()
    assert tokens[0] == argmax[0] and tokens[2] == argmax[2]
    assert runner.last_ids[:3].tolist() == tokens  # what the next iteration's fed tokens read
    again = runner.sample(Forward(logits), Sampler(), params, [0, 1, 2]).wait()
    assert again[1] == tokens[1]  # the seeded row is reproducible, with or without a replay


def test_ids_are_read_in_launch_order_and_a_reused_buffer_is_an_error():
    runner = _runner()
    launched = []
    for seed in range(3):  # three in flight: the first one's host buffer was handed out again
        logits = _logits(5, 10 + seed)
        launched.append((runner.sample(Forward(logits), Sampler(), [SamplingParams()] * 5, list(range(5))),
                         logits.argmax(-1).tolist()))
    with pytest.raises(RuntimeError, match="reused"):
        launched[0][0].wait()
    for tokens, expected in launched[1:]:
        assert tokens.wait() == expected
