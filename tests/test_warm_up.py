"""The generator's warm-up burst (backend/decoder/warm_up.py): it runs the mixes that traffic
builds (several prompts packed in one iteration, chunked long prompts, decode rows beside prompt
chunks, sampled and greedy rows), answers nobody, counts nothing, and leaves the engine as it
found it: empty, every KV block free, and the next request's tokens those of Hugging Face."""
from __future__ import annotations

import pytest
import torch
import transformers

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.decoder.build import EngineOptions, build_engine
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.decoder.warm_up import warm_up_traffic
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.client.hf_reference import generate_greedy, left_pad

CPU = torch.device("cpu")


class Recorder:
    """Sink and stats at once: nothing may reach either during the warm-up."""

    def __init__(self):
        self.calls = []

    def send(self, handle, outputs, error, final):
        self.calls.append(("send", handle, outputs, error, final))

    def is_cancelled(self, handle):
        return False

    def __getattr__(self, name):  # iteration_done, occupancy, request_done
        return lambda *a, **k: self.calls.append((name, a, k))


@pytest.fixture(scope="module")
def tiny():
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=2, n_positions=256,
                                  initializer_range=0.5)
    torch.manual_seed(5)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    return hf, load_decoder(cfg.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)


class _Ids:
    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def test_the_burst_runs_the_mixes_of_traffic_and_leaves_nothing_behind(tiny):
    hf, model = tiny
    recorder = Recorder()
    options = EngineOptions(max_running_sequences=16, max_tokens_per_iteration=64, kv_cache_tokens="2048",
                            kv_block_size=8, cuda_graphs=False)
    engine = build_engine(model, _Ids(), recorder, options, stats=recorder)
    mixes = []
    plain_run = engine.runner.run

    def run(entries):
        mixes.append(([len(e.tokens) for e in entries], [e.start for e in entries]))
        return plain_run(entries)

    engine.runner.run = run
    iterations = warm_up_traffic(engine, requests=48, max_new_tokens=8)

    assert iterations >= 10 and recorder.calls == []
    assert not engine.has_work() and engine.scheduler.blocks.num_used == 0
    prompts = [lengths for lengths, _ in mixes if sum(n > 1 for n in lengths) >= 2]
    assert prompts, "no iteration packed several prompts"
    assert any(1 in lengths and any(n > 1 for n in lengths) for lengths, _ in mixes), "no decode beside a prompt"
    assert any(n > 1 and start > 0 for lengths, starts in mixes for n, start in zip(lengths, starts)), \
        "no prompt ran in chunks"

    # The engine serves as if the warm-up never happened.
    engine.runner.run = plain_run
    prompt = [7, 11, 13, 17, 19]
    engine.admit([engine.new_sequence("h", prompt, SamplingParams(max_tokens=6, ignore_eos=True), False)])
    while engine.has_work():
        engine.step()
    (_, handle, outputs, error, final), = [c for c in recorder.calls if c[0] == "send"]
    ids, mask = left_pad([prompt], "cpu")
    assert handle == "h" and error is None and final
    assert outputs["output_ids"].tolist() == generate_greedy(hf, ids, mask, 6)[0, len(prompt):].tolist()
