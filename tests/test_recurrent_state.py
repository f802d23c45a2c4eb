"""Recurrent state beyond the model (decoder/state_cache.py): a hybrid model (LFM2, whose short convolutions
carry each sequence's last inputs) and an attention-free one (Mamba: a KV cache of no layer, whose blocks only
count tokens) through the real engine (build.build_engine) on the CPU, with more requests
than state slots, so sequences queue and take slots others gave back, a KV pool so small that sequences are
preempted and recompute (their state must start again from zero), prompts in chunks beside decodes and rounds
of several decode iterations: every output equals Hugging Face's greedy continuation. And the scheduler's slots
(scheduler/iteration.py, driven by a fake engine): unique among running sequences, given back on finish and on
preemption, refused with prefix caching, no prompt blocks shared by forks."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tritonformer.backend.checkpoints.weights import strip_prefixes_of
from tritonformer.backend.decoder.build import EngineOptions, build_engine
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.models.decoder import load_decoder
from tritonformer.client.model_shapes import shrunk
from tritonformer.scheduler.iteration import IterationScheduler
from tritonformer.scheduler.kv_blocks import BlockManager

from test_decode_rounds import RecordingSink, TagTokenizer  # (tests/ helpers: the engine's sink and tokenizer)
from test_iteration_scheduler import FakeSeq as SchedulerSeq

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def lfm2():
    """A tiny LFM2 (conv, attention, conv; a conv bias) in HF and ours on the same random weights, at most 64
    tokens a sequence (so a 64-token KV pool is allowed and a few sequences outgrow it)."""
    # (weights wide enough (initializer_range) that the continuations vary: 0.02's repeat one token)
    cfg = {**shrunk("lfm2-1.2b"), "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
           "conv_bias": True, "max_position_embeddings": 64, "initializer_range": 0.1}
    cfg.pop("model_type")
    torch.manual_seed(5)
    hf = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**cfg)).eval()
    with torch.no_grad():  # (norms and biases off their init of ones and zeros)
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return hf, load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)


@pytest.fixture(scope="module")
def mamba():
    """A tiny Mamba (two Mamba-1 layers, no attention: the KV cache holds no layer, its blocks only count tokens, so
    the same 64-token pool preempts), in HF and ours on the same random weights, at most 64 tokens a sequence."""
    cfg = {**shrunk("mamba-2.8b"), "max_position_embeddings": 64, "initializer_range": 0.3}
    cfg.pop("model_type")
    torch.manual_seed(5)
    hf = transformers.MambaForCausalLM(transformers.MambaConfig(**cfg)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model = load_decoder(hf.config.to_dict(), strip_prefixes_of(hf.state_dict()), CPU, torch.float32)
    assert model.num_kv_layers == 0
    return hf, model


@pytest.fixture(scope="module")
def kimi_linear():
    """A tiny Kimi Linear (a KDA layer, whose state is a convolution's inputs and a matrix per head, then latent
    attention and experts) in HF and ours, as the family tests build it, at most 64 tokens a sequence."""
    from test_decoder_families import _pair

    return _pair("kimi-linear-48b-a3b", {"max_position_embeddings": 64}, seed=3)


@pytest.fixture(scope="module")
def ling():
    """A tiny Ling 3.0 (a KDA layer with the bounded decay, then latent attention gated per head and experts) in HF
    and ours, as the family tests build it, at most 64 tokens a sequence."""
    from test_decoder_families import _pair

    return _pair("ling-3.0-flash", {"max_position_embeddings": 64}, seed=3)


@pytest.fixture(scope="module")
def minimax():
    """A tiny MiniMax (a lightning-attention layer, whose state is a decaying matrix per head, then softmax attention;
    experts in both) in HF and ours, as the family tests build it, at most 64 tokens a sequence."""
    from test_decoder_families import _pair

    # (weights drawn wider: 0.02 and 0.1 repeat a few tokens, the stream being mostly 3.56 x the normed input)
    return _pair("minimax-text-01", {"max_position_embeddings": 64, "initializer_range": 0.3}, seed=3)


@pytest.fixture(scope="module")
def recurrent_gemma():
    """A tiny RecurrentGemma (an RG-LRU layer, whose state is a convolution's inputs and a vector per channel, local
    attention over 8 tokens, an RG-LRU layer) in HF and ours, as the family tests build it, at most 64 tokens a
    sequence."""
    from test_decoder_families import _pair

    return _pair("recurrentgemma-2b", {"num_hidden_layers": 3, "w_init_variance_scale": 1.0,
                                       "max_position_embeddings": 64}, seed=3)


@pytest.fixture(scope="module")
def xlstm():
    """A tiny xLSTM (two mLSTM blocks, no attention: each sequence's state a matrix memory, a normaliser and a
    stabiliser per head; 16-token chunks) in HF and ours, as the family tests build it, at most 64 tokens a sequence."""
    from test_decoder_families import _pair

    return _pair("xlstm-7b", {"max_position_embeddings": 64}, seed=3)


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    if hf.config.model_type == "recurrent_gemma":  # (a stateful model: its blocks keep the last generation's conv
        # inputs, which a one-token prompt's first step, a decode step, would read; zeroed, as a new sequence's)
        hf._setup_cache(hf.config, 1, CPU, torch.float32)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["lfm2", "mamba", "kimi_linear", "ling", "minimax", "recurrent_gemma",
                                    "xlstm"])
@pytest.mark.parametrize("steps", [1, 4])
def test_engine_with_queued_preempted_sequences_is_hf_greedy(family, steps, request):
    hf, model = request.getfixturevalue(family)  # (LFM2: a hybrid; Mamba: attention-free, a KV cache of no layer)
    gen = torch.Generator().manual_seed(9)
    lengths = (23, 5, 17, 30, 9, 1)
    prompts = [torch.randint(3, 320, (n,), generator=gen).tolist() for n in lengths]
    new = [24, 31, 20, 12, 40, 25]
    options = EngineOptions(kv_cache_tokens="64", kv_block_size=4, max_running_sequences=3,
                            max_tokens_per_iteration=12, max_decode_steps=steps, cuda_graphs=False,
                            prefix_caching=True)  # (which a model with recurrent state goes without)
    sink = RecordingSink()
    engine = build_engine(model, TagTokenizer(), sink, options)
    scheduler, state = engine.scheduler, engine.runner.cache.state
    assert state is not None and state.num_slots == 3 and scheduler.prefix_cache is None
    rounds, run_steps = [], engine.runner.run_steps
    engine.runner.run_steps = lambda *args, **kwargs: rounds.append(1) or run_steps(*args, **kwargs)
    engine.admit([engine.new_sequence(i, p, SamplingParams(max_tokens=n, ignore_eos=True), False)
                  for i, (p, n) in enumerate(zip(prompts, new))])
    held: set[int] = set()
    while engine.has_work():
        engine.step()
        slots = [s.state_slot for s in scheduler.running]
        assert sorted(slots) == sorted(set(slots)) and all(0 <= s < 3 for s in slots)
        held |= set(slots)
    assert scheduler.num_preemptions > 0  # (the pool holds 64 tokens; three running sequences outgrow it)
    assert bool(rounds) == (steps > 1)  # (rounds of several decode iterations, where allowed, ran)
    assert held == {0, 1, 2} and sorted(scheduler.free_state_slots) == [0, 1, 2] and scheduler.blocks.num_used == 0
    for i, (prompt, n) in enumerate(zip(prompts, new)):
        ids = [t for outputs, _ in sink.responses[i] for t in outputs["output_ids"].tolist()]
        expected = _hf_greedy(hf, prompt, n)
        assert len(set(expected)) > n // 2  # (a continuation that varies: one that repeats a token proves little)
        assert ids == expected, i


# ---------------------------------------------------------------------------- the scheduler's state slots


@dataclass(eq=False)
class FakeSeq(SchedulerSeq):
    """The scheduler tests' fake sequence (arrival, prompt, target), with the state slot the scheduler gives it."""

    state_slot: int = -1


def _drive(sched: IterationScheduler, on_schedule=None) -> list[FakeSeq]:
    """Run the fake engine to the end: each iteration's sampling sequences gain a token, finished ones leave.
    Returns the sequences in the order they finished."""
    done = []
    while sched.has_work():
        it = sched.schedule()
        if on_schedule is not None:
            on_schedule(it)
        sched.commit(it)
        for e in it.all():
            if e.samples:
                e.seq.generated += 1
                if e.seq.generated >= e.seq.target:
                    sched.finish(e.seq)
                    done.append(e.seq)
    return done


def _check_slots(sched: IterationScheduler, max_running: int) -> None:
    """Every running sequence holds a slot of its own; every slot is held or free, never both."""
    held = [s.state_slot for s in sched.running]
    assert len(set(held)) == len(held) and all(0 <= s < max_running for s in held)
    assert sorted(held + sched.free_state_slots) == list(range(max_running))
    assert all(s.state_slot == -1 for s in sched.waiting)


def test_slots_are_unique_while_running_and_given_back_when_sequences_finish():
    sched = IterationScheduler(BlockManager(200, 4), 3, 16, recurrent_state=True)
    seqs = [FakeSeq(0, prompt=p, target=t) for p, t in ((9, 5), (3, 12), (20, 2), (6, 7), (11, 3), (4, 9), (1, 4))]
    for s in seqs:
        sched.add(s)
    slots_used: dict[int, list] = {}

    def check(it):
        _check_slots(sched, 3)
        for s in it.admitted:
            slots_used.setdefault(s.state_slot, []).append(s)

    done = _drive(sched, check)
    assert sorted(map(id, done)) == sorted(map(id, seqs))
    assert sorted(sched.free_state_slots) == [0, 1, 2] and all(s.state_slot == -1 for s in seqs)
    assert sum(len(v) for v in slots_used.values()) == 7 and max(len(v) for v in slots_used.values()) > 1  # reused


def test_a_preempted_sequence_gives_its_slot_back_and_rejoins_with_one():
    sched = IterationScheduler(BlockManager(12, 4), 3, 64, recurrent_state=True)  # 48 tokens for 3 x 30
    seqs = [FakeSeq(0, prompt=10, target=20) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    preempted = []

    def check(it):
        _check_slots(sched, 3)
        for s in it.preempted:
            assert s.state_slot == -1 and s.num_computed == 0  # (it recomputes: its state restarts from zero)
            preempted.append(s)

    _drive(sched, check)
    assert preempted and sched.num_preemptions == len(preempted)
    assert sorted(sched.free_state_slots) == [0, 1, 2]


def test_finishing_a_waiting_sequence_frees_no_slot():
    sched = IterationScheduler(BlockManager(64, 4), 1, 16, recurrent_state=True)
    running, waiting = FakeSeq(0, prompt=4, target=3), FakeSeq(0, prompt=4, target=3)
    sched.add(running)
    sched.add(waiting)
    sched.schedule()
    assert running.state_slot == 0 and waiting.state_slot == -1 and sched.free_state_slots == []
    sched.finish(waiting)  # (cancelled while queued)
    assert sched.free_state_slots == [] and running.state_slot == 0
    sched.finish(running)
    assert sched.free_state_slots == [0]


def test_prefix_caching_is_refused_with_recurrent_state():
    with pytest.raises(ValueError, match="prefix caching"):
        IterationScheduler(BlockManager(64, 4), 2, 16, prefix_caching=True, recurrent_state=True)


def test_forks_share_no_prompt_blocks_with_recurrent_state():
    """A fork's state cannot start where its leader's prompt left off (the state is not in the blocks): forks
    are sequences of their own from the first token; without recurrent state they share the prompt's blocks."""
    for recurrent, shares in ((True, False), (False, True)):
        sched = IterationScheduler(BlockManager(64, 4), 4, 64, recurrent_state=recurrent)
        leader, forks = FakeSeq(0, prompt=13, target=3), [FakeSeq(0, prompt=13, target=3) for _ in range(2)]
        sched.add(leader)
        sched.add_forks(leader, forks, 13)
        starts = {}

        def check(it):
            for e in it.all():
                starts.setdefault(id(e.seq), e.start)
            if recurrent:
                _check_slots(sched, 4)

        _drive(sched, check)
        assert (starts[id(forks[0])] > 0) == shares and (starts[id(forks[1])] > 0) == shares
        assert sched.blocks.num_used == 0
