"""Hugging Face baselines of the decoder benchmark (suite D of docs/peers: D-static and D-hfcb).

Everything here runs in a plain Python process with torch and transformers (never inside the
Triton stub: the image's transformers does not import under the stub's numpy 1.x).

* ``orca_trace`` / ``fixed_trace``: the request traces (prompt token ids + per-request budget).
* ``random_gpt2`` / ``random_llama_1b``: randomly initialised models of the two benchmark shapes
  (no weights can be downloaded on the GPU machine).
* ``hf_step_time``: milliseconds per decode step of ``model.generate`` at a fixed batch.
* ``request_level``: Orca's baseline, request-level batching with HF ``generate``: batches of
  32 in arrival order, left padded, each batch running until its longest member is done.
* ``hf_continuous_batching``: transformers' own continuous batching (``ContinuousBatchingManager``,
  paged KV cache) on the same trace, each request with its own ``max_new_tokens``.

All three systems ignore EOS and count only *useful* tokens: the sum of every request's own
``max_new_tokens``. Timing uses ``time.perf_counter`` with ``torch.cuda.synchronize()`` on CUDA;
every system is warmed up once with a small batch before it is timed. Progress goes to stderr.
"""
from __future__ import annotations

import dataclasses
import inspect
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

__all__ = [
    "TraceRequest",
    "orca_trace",
    "fixed_trace",
    "random_gpt2",
    "random_llama_1b",
    "hf_step_time",
    "request_level",
    "hf_continuous_batching",
]


@dataclass
class TraceRequest:
    prompt_ids: list[int]
    max_new_tokens: int


def _log(msg: str) -> None:
    print(f"[hf-baseline] {msg}", file=sys.stderr, flush=True)


def _token_high(vocab_size: int) -> int:
    """Exclusive upper bound for random prompt ids that keeps out the well-known special tokens:
    GPT-2's only special token is its last id (50256, <|endoftext|>); Llama-3's 256 special tokens
    are ids 128000..128255. Other vocabularies are used whole."""
    if vocab_size == 50257:
        return 50256
    if vocab_size == 128256:
        return 128000
    return vocab_size


def _prompts(rng: np.random.Generator, lengths, vocab_size: int) -> list[list[int]]:
    high = _token_high(vocab_size)
    return [rng.integers(0, high, int(n)).tolist() for n in lengths]


def orca_trace(
    num_requests: int = 256,
    seed: int = 0,
    prompt_range: tuple[int, int] = (32, 512),
    output_range: tuple[int, int] = (1, 128),
    vocab_size: int = 50257,
) -> list[TraceRequest]:
    """Orca-style synthetic trace: prompt and output lengths uniform on the inclusive ranges.

    Draw order (one ``numpy.random.default_rng(seed)``): all prompt lengths first, then all output
    lengths, then each request's prompt ids in turn. Prompt lengths first is the order that
    reproduces the issue's number: n=256, seed 0, U[32,512] / U[1,128] gives 17,193 output tokens
    (72,245 prompt tokens). The other order (outputs first) gives 17,215.
    """
    rng = np.random.default_rng(seed)
    p_lo, p_hi = prompt_range
    o_lo, o_hi = output_range
    prompt_lens = rng.integers(p_lo, p_hi + 1, num_requests)
    output_lens = rng.integers(o_lo, o_hi + 1, num_requests)
    prompts = _prompts(rng, prompt_lens, vocab_size)
    return [TraceRequest(p, int(o)) for p, o in zip(prompts, output_lens)]


def fixed_trace(
    prompt_len: int, output_len: int, num_requests: int, seed: int = 0, vocab_size: int = 50257
) -> list[TraceRequest]:
    """``num_requests`` requests, each with a ``prompt_len`` random prompt and ``output_len`` budget."""
    rng = np.random.default_rng(seed)
    prompts = _prompts(rng, [prompt_len] * num_requests, vocab_size)
    return [TraceRequest(p, int(output_len)) for p in prompts]


def useful_tokens(trace: list[TraceRequest]) -> int:
    return sum(r.max_new_tokens for r in trace)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def _finish_model(model, device, dtype):
    model = model.to(device=device, dtype=dtype).eval()
    # Greedy, no EOS: every request runs exactly its budget in every system.
    gc = model.generation_config
    gc.do_sample = False
    gc.eos_token_id = None
    gc.pad_token_id = 0
    return model


def random_gpt2(device="cpu", dtype=None, config=None):
    """GPT2LMHeadModel with random weights; ``GPT2Config()`` defaults are gpt2 (124M).
    ``config`` (optional) replaces the default, for tiny smoke tests."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = config if config is not None else GPT2Config()
    cfg._attn_implementation = getattr(cfg, "_attn_implementation", None) or "sdpa"
    model = GPT2LMHeadModel(cfg)
    return _finish_model(model, device, dtype or torch.float32)


def llama_1b_config():
    """Llama-3.2-1B-shaped config (no rope_scaling; 8192 positions to keep rope tables small)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        # 5.x keeps rope settings in rope_parameters (rope_theta= alone is not read by every 5.x).
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=128000,
        eos_token_id=128001,
        attention_bias=False,
        mlp_bias=False,
    )


def random_llama_1b(device="cpu", dtype=None, config=None):
    """LlamaForCausalLM with random weights and the Llama-3.2-1B shape (``config`` overrides)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = config if config is not None else llama_1b_config()
    cfg._attn_implementation = getattr(cfg, "_attn_implementation", None) or "sdpa"
    model = LlamaForCausalLM(cfg)
    return _finish_model(model, device, dtype or torch.float32)


# --------------------------------------------------------------------------------------------
# HF generate helpers
# --------------------------------------------------------------------------------------------


def _device_of(model, device):
    import torch

    return torch.device(device) if device is not None else model.device


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _gen_config(new_tokens: int):
    """Greedy, exactly ``new_tokens`` tokens: EOS disabled (None) and min_new_tokens = max_new_tokens."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )


def left_pad(prompts: list[list[int]], device):
    """Prompts as one left-padded batch (ids, attention mask), the way HF `generate` wants them."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def generate_greedy(model, ids, mask, new_tokens: int):
    """Exactly `new_tokens` greedy tokens for every row (EOS ignored); returns prompt + output ids."""
    import torch

    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen_config(new_tokens))
    return out


def hf_step_time(model, batch_size: int, context_len: int = 128, steps: int = 64, device=None, repeats: int = 3) -> float:
    """Milliseconds per decode step of HF ``generate`` (greedy, EOS ignored) at ``batch_size``.

    (time to generate ``steps`` tokens - time to generate 1 token, i.e. the prefill) / (steps - 1),
    each time the median of ``repeats`` runs after one warm-up of both.
    """
    import torch

    if steps < 2:
        raise ValueError("steps must be >= 2")
    device = _device_of(model, device)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, _token_high(vocab), (batch_size, context_len), generator=g).to(device)
    mask = torch.ones_like(ids)

    def timed(n: int) -> float:
        _sync(device)
        t0 = time.perf_counter()
        out = generate_greedy(model, ids, mask, n)
        _sync(device)
        dt = time.perf_counter() - t0
        assert out.shape[1] == context_len + n, (out.shape, context_len, n)
        return dt

    timed(steps)  # warm-up
    timed(1)
    t_full = statistics.median(timed(steps) for _ in range(repeats))
    t_prefill = statistics.median(timed(1) for _ in range(repeats))
    ms = (t_full - t_prefill) / (steps - 1) * 1e3
    _log(f"step time: batch {batch_size}, context {context_len}: {ms:.3f} ms/step "
         f"(generate {steps}: {t_full * 1e3:.1f} ms, prefill: {t_prefill * 1e3:.1f} ms)")
    return ms


# --------------------------------------------------------------------------------------------
# D-static: request-level batching (Orca's baseline)
# --------------------------------------------------------------------------------------------


def request_level(model, trace: list[TraceRequest], batch_size: int = 32, device=None) -> dict:
    """Requests in arrival order, batches of ``batch_size``; each batch is one left-padded HF
    ``generate`` run for the batch's largest budget (EOS ignored), so short requests wait for the
    longest. Only each request's own budget counts as useful.
    """
    device = _device_of(model, device)
    # Warm-up: one small batch (first few requests, short budget).
    warm = trace[: min(4, len(trace))]
    ids, mask = left_pad([r.prompt_ids for r in warm], device)
    generate_greedy(model, ids, mask, min(4, max(r.max_new_tokens for r in warm)))
    _sync(device)

    useful = useful_tokens(trace)
    generated = 0
    nbatches = (len(trace) + batch_size - 1) // batch_size
    _sync(device)
    t0 = time.perf_counter()
    for b in range(nbatches):
        batch = trace[b * batch_size:(b + 1) * batch_size]
        new = max(r.max_new_tokens for r in batch)
        ids, mask = left_pad([r.prompt_ids for r in batch], device)
        tb = time.perf_counter()
        out = generate_greedy(model, ids, mask, new)
        _sync(device)
        if out.shape[1] != ids.shape[1] + new:
            raise RuntimeError(f"generate stopped early: {out.shape[1] - ids.shape[1]} of {new} tokens")
        generated += len(batch) * new
        _log(f"request-level batch {b + 1}/{nbatches}: {len(batch)} requests, prompt width "
             f"{ids.shape[1]}, {new} steps, {time.perf_counter() - tb:.2f} s")
    seconds = time.perf_counter() - t0
    return {
        "useful_tokens": useful,
        "generated_tokens": generated,
        "seconds": seconds,
        "tok_per_s": useful / seconds,
    }


# --------------------------------------------------------------------------------------------
# D-hfcb: transformers' continuous batching
# --------------------------------------------------------------------------------------------


def _cb_api(model):
    """The continuous-batching pieces of this transformers, or a RuntimeError saying what is missing."""
    import transformers

    if not hasattr(model, "init_continuous_batching"):
        raise RuntimeError(
            f"transformers {transformers.__version__} has no continuous batching "
            "(model.init_continuous_batching missing)"
        )
    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError:  # older 5.x: options lived on GenerationConfig
        ContinuousBatchingConfig = None
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        WorkloadHints = None
    from transformers.generation.continuous_batching import ContinuousBatchingManager

    add_params = inspect.signature(ContinuousBatchingManager.add_request).parameters
    if "max_new_tokens" not in add_params:
        raise RuntimeError(
            f"transformers {transformers.__version__}: ContinuousBatchingManager.add_request takes no "
            "per-request max_new_tokens"
        )
    return ContinuousBatchingConfig, WorkloadHints, add_params


def _make_kwargs(cls, **wanted):
    """Keep only the options this version's class knows (field names moved between 5.x releases)."""
    if cls is None:
        return {}
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
    else:
        names = set(inspect.signature(cls).parameters)
    return {k: v for k, v in wanted.items() if k in names and v is not None}


def hf_continuous_batching(model, trace: list[TraceRequest], device=None, max_batch_tokens: int | None = None,
                           max_requests_per_batch: int | None = None, num_blocks: int | None = None) -> dict:
    """transformers' continuous batching on the trace, each request with its own budget.

    API used (transformers 5.17 and later 5.x alike): ``model.init_continuous_batching(
    generation_config, continuous_batching_config, workload_hints)`` returns a
    ``ContinuousBatchingManager``; ``manager.warmup()`` pre-captures CUDA graphs, ``start()`` runs
    the scheduling loop in a background thread, ``add_request(input_ids, request_id,
    max_new_tokens=..., eos_token_id=-1)`` queues one request with its **own** budget (so every
    request generates exactly its ``max_new_tokens``, unlike ``generate_batch`` whose
    ``max_new_tokens`` is one value for all), ``get_result(timeout=...)`` returns finished
    ``GenerationOutput`` objects; ``stop()`` + ``destroy()`` at the end.

    EOS: ``eos_token_id=-1`` (no token matches), greedy decoding. The attention implementation is
    left to the manager: it switches the model's "sdpa" to its paged form ("paged|sdpa" in 5.17,
    "sdpa" itself with a paged cache in later 5.x) or to flash attention when flash-attn is
    installed, and restores the original on stop. Block (prefix) sharing is turned off so the
    warm-up requests cannot seed the cache. ``max_batch_tokens`` / ``max_requests_per_batch`` /
    ``num_blocks`` (KV-cache blocks of 256 tokens) go to ``ContinuousBatchingConfig``; None lets
    transformers size them from free device memory (on CPU that means free RAM: pass a small
    ``num_blocks`` there).
    Raises RuntimeError("...") when the API is missing or the run fails.
    """
    import torch
    import transformers
    from transformers import GenerationConfig

    ContinuousBatchingConfig, WorkloadHints, _ = _cb_api(model)
    device = _device_of(model, device)

    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max(r.max_new_tokens for r in trace),
                               eos_token_id=-1, pad_token_id=0)
    cb_kwargs = _make_kwargs(ContinuousBatchingConfig, max_batch_tokens=max_batch_tokens,
                             max_requests_per_batch=max_requests_per_batch, num_blocks=num_blocks,
                             allow_block_sharing=False)
    cb_cfg = ContinuousBatchingConfig(**cb_kwargs) if ContinuousBatchingConfig is not None else None
    init_kwargs = {"generation_config": gen_cfg}
    init_params = inspect.signature(model.init_continuous_batching).parameters
    if cb_cfg is not None and "continuous_batching_config" in init_params:
        init_kwargs["continuous_batching_config"] = cb_cfg
    if WorkloadHints is not None and "workload_hints" in init_params:
        init_kwargs["workload_hints"] = WorkloadHints(
            max_prompt_length=max(len(r.prompt_ids) for r in trace),
            max_generated_length=max(r.max_new_tokens for r in trace),
            num_requests=len(trace),
        )

    # Warm-up requests: fresh random prompts (not from the trace), a few short budgets.
    rng = np.random.default_rng(12345)
    vocab = model.config.vocab_size
    warm = [TraceRequest(rng.integers(0, _token_high(vocab), min(len(r.prompt_ids), 64)).tolist(),
                         min(r.max_new_tokens, 8)) for r in trace[: min(4, len(trace))]]

    manager = model.init_continuous_batching(**init_kwargs)
    attn = getattr(model.config, "_attn_implementation", None)
    _log(f"continuous batching: transformers {transformers.__version__}, attention {attn}, "
         f"config {cb_kwargs}")
    counter = [0]

    def run(reqs: list[TraceRequest], label: str, report_every: int = 0):
        ids = {}
        for r in reqs:
            rid = f"{label}_{counter[0]}"
            counter[0] += 1
            got = manager.add_request(input_ids=list(r.prompt_ids), request_id=rid,
                                      max_new_tokens=r.max_new_tokens, eos_token_id=-1)
            if got is None:
                raise RuntimeError("continuous batching manager refused a request")
            ids[rid] = r
        done: dict = {}
        while len(done) < len(ids):
            res = manager.get_result(timeout=1)
            if res is None:
                if not manager.is_running():
                    raise RuntimeError(
                        f"continuous batching loop stopped with {len(ids) - len(done)} requests unfinished")
                continue
            if res.request_id in ids and res.is_finished():
                if res.error is not None:
                    raise RuntimeError(f"continuous batching request {res.request_id} failed: {res.error}")
                done[res.request_id] = res
                if report_every and (len(done) % report_every == 0 or len(done) == len(ids)):
                    _log(f"continuous batching: {len(done)}/{len(ids)} requests done, "
                         f"{time.perf_counter() - t0:.2f} s")
        return ids, done

    try:
        if hasattr(manager, "warmup"):
            manager.warmup()
        manager.start()
        t0 = time.perf_counter()
        run(warm, "warm")
        _sync(device)
        t0 = time.perf_counter()
        ids, done = run(trace, "req", report_every=32)
        _sync(device)
        seconds = time.perf_counter() - t0
    except RuntimeError:
        raise
    except Exception as e:  # noqa: BLE001 - report any API mismatch as a clear n/a reason
        raise RuntimeError(f"transformers {transformers.__version__} continuous batching failed: "
                           f"{type(e).__name__}: {e}") from e
    finally:
        try:
            manager.stop(block=True, timeout=30)
        finally:
            if hasattr(manager, "destroy"):
                manager.destroy()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()

    generated = sum(len(done[rid].generated_tokens) for rid in ids)
    useful = sum(min(len(done[rid].generated_tokens), r.max_new_tokens) for rid, r in ids.items())
    if useful != useful_tokens(trace):
        short = [(rid, len(done[rid].generated_tokens), r.max_new_tokens) for rid, r in ids.items()
                 if len(done[rid].generated_tokens) < r.max_new_tokens][:5]
        raise RuntimeError(f"continuous batching produced fewer tokens than budgeted, e.g. {short}")
    return {
        "useful_tokens": useful,
        "generated_tokens": generated,
        "seconds": seconds,
        "tok_per_s": useful / seconds,
        "attn_implementation": attn,
    }
