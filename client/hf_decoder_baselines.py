"""Hugging Face's own ways of running the decoder benchmark's traces, timed (suite D of docs/peers:
D-static and D-hfcb): the baselines `tritonformer bench serve-decoder` compares our engine with.

Everything here runs in a plain Python process with torch and transformers (never inside the
Triton stub: the image's transformers does not import under the stub's numpy 1.x). The traces
are client/traces.py's, the random-weight models client/hf_reference.py's.

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

import numpy as np

from tritonformer.client.hf_reference import generate_greedy, left_pad
from tritonformer.client.traces import TraceRequest, token_high, useful_tokens

__all__ = [
    "hf_step_time",
    "request_level",
    "hf_continuous_batching",
]


def _log(msg: str) -> None:
    print(f"[hf-baseline] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


def _device_of(model, device):
    import torch

    return torch.device(device) if device is not None else model.device


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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
    ids = torch.randint(0, token_high(vocab), (batch_size, context_len), generator=g).to(device)
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
    warm = [TraceRequest(rng.integers(0, token_high(vocab), min(len(r.prompt_ids), 64)).tolist(),
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
