"""The decoder engine: one model iteration at a time over all active sequences (Orca).

Each loop step asks the iteration scheduler which tokens run (one per decoding sequence, then
prompt chunks within the token budget), runs one forward over all of them on the paged KV
cache, samples the sequences whose last known token ran, and streams the new text. Sequences
join and leave between iterations; their KV blocks are freed the moment they finish or are
cancelled.

The host runs one iteration ahead of the GPU. A step launches iteration i+1 and only then waits
for iteration i's tokens and does their bookkeeping (stop checks, detokenization, responses),
so that work, and the scheduling of i+1, overlap the GPU running. A sampled token is therefore
*reserved* at launch (a placeholder in `output_ids` that names its row on the device, so the
next iteration can consume it) and *resolved* when it reaches the host. A sequence that stops
on a token of iteration i has one more token computed in i+1, which is dropped; lengths are
known in advance, so a sequence never runs past max_tokens or the context window.

When every running sequence decodes and nobody waits, one launch may cover several iterations
(the scheduler's `max_decode_steps`): the GPU moves each sequence on to its own sample, and the
host's work per launch (above) is shared by all of them. A sequence that stops inside such a
round has its later tokens of the round dropped, like the one token above.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from tritonformer.backend.decoder.batch import BatchEntry
from tritonformer.backend.decoder.runner import MAX_DECODE_STEPS, DecoderRunner, SampledTokens, fed_token
from tritonformer.backend.decoder.detokenizer import IncrementalDetokenizer
from tritonformer.backend.decoder.outputs import RequestGroup, ResponseOptions, extra_outputs
from tritonformer.backend.engine_loop import EngineLoop, log
from tritonformer.backend.responses import ResponseSink
from tritonformer.backend.decoder.sampling_params import SamplingParams
from tritonformer.backend.decoder.sampling import Sampler, sample_seed
from tritonformer.backend.decoder.structured import prepare_grammars
from tritonformer.backend.errors import InvalidRequest
from tritonformer.backend.tokenization import TextTokenizer
from tritonformer.scheduler.iteration import Iteration, IterationScheduler

_ids = itertools.count()
CANCEL_CHECKS_PER_S = 1000  # cancellation polls (IPC round trips) per second at most, round-robin


class GeneratorStats(Protocol):
    """Where the engine reports what it did (Triton metrics in the glue; nothing in tests)."""

    def iteration_done(self, tokens: int, preempted: int) -> None: ...

    def occupancy(self, running: int, waiting: int, kv_blocks_used: int, kv_blocks_free: int, kv_bytes: int) -> None: ...

    def request_done(self, ttft: float | None, tpot: float | None, output_tokens: int,
                     queue_wait: float | None = None) -> None: ...

    def prefix_cache_lookups(self, queries: int, hits: int, hit_tokens: int) -> None: ...


@dataclass
class _Launched:
    """A launch on the GPU (one iteration, or a round of several): which sequence each sampled
    row belongs to, where in its output_ids its tokens go, and how many it gets."""

    samples: list[tuple["Sequence", int, int]]  # (sequence, index of its first token, tokens)
    tokens: SampledTokens


@dataclass(eq=False)  # identity equality: the scheduler removes sequences by identity
class Sequence:
    handle: Any
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    detok: IncrementalDetokenizer
    key: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.monotonic)
    # Output tokens at which it ends by length: max_tokens, or the context window's end.
    # Decided when a token is reserved (nothing is scheduled after it), applied when it arrives.
    max_output: int | None = None  # (None: max_tokens)
    output_ids: list[int] = field(default_factory=list)
    unsent_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)  # its KV blocks (the scheduler's)
    state_slot: int = -1  # its recurrent state's slot while running, in a hybrid model (the scheduler's)
    num_computed: int = 0  # tokens whose keys/values are in the cache
    finish_reason: str | None = None
    scheduled_at: float | None = None  # when its first prompt token was first scheduled
    first_token_at: float | None = None
    last_sent_at: float | None = None  # when its last streamed response left
    # What its responses carry beyond text and ids (the vLLM contract's outputs), and for n > 1
    # which sample it is, its request's other samples (on the first only) and their group.
    options: ResponseOptions = field(default_factory=ResponseOptions)
    index: int = 0
    forks: list["Sequence"] = field(default_factory=list)
    group: RequestGroup | None = None
    logprobs: list[dict] = field(default_factory=list)  # per output token taken, when asked for
    logprobs_sent: int = 0  # logprobs[:logprobs_sent] went out in streamed responses
    echo_pending: bool = True  # the echoed prompt has not gone out yet

    # Tokens the scheduler may compute: prompt + output, reserved ones included, except a
    # reserved token that will be the last (nothing runs after it). Read for every sequence
    # every iteration, hence a counter.
    num_tokens: int = 0
    num_resolved: int = 0  # output_ids[:num_resolved] are real tokens; the rest are reserved
    token_limit: int = 0  # prompt + max_output: the most tokens it will hold (the scheduler's)

    # Its next sample needs its last token on the host (a structured output's grammar): no round
    # of several iterations, and no iteration while that token is on its way (the scheduler's).
    one_step: bool = False

    @property
    def host_pending(self) -> bool:
        """A sampled token of it has not reached the host yet."""
        return self.num_resolved < len(self.output_ids)

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt_ids) + len(self.output_ids)
        self.num_resolved = len(self.output_ids)
        if self.max_output is None:
            self.max_output = self.params.max_tokens
        self.token_limit = len(self.prompt_ids) + self.max_output

    def reserve(self, row: int) -> int:
        """A token of the launched iteration's row `row` will be this sequence's next output;
        returns its index in output_ids."""
        self.output_ids.append(fed_token(row))
        n = len(self.output_ids)
        if n < self.max_output:  # else the sequence ends with it: nothing runs after it
            self.num_tokens += 1
        return n - 1

    def reserve_steps(self, row: int, n: int) -> int:
        """`reserve` for a round of `n` iterations (the row's samples, each fed to the next);
        returns the index of the first."""
        first = len(self.output_ids)
        self.output_ids.extend([fed_token(row)] * n)  # (only the last is ever fed)
        # As n calls of reserve: each token but one that ends the sequence counts.
        self.num_tokens += max(0, min(n, self.max_output - 1 - first))
        return first

    def resolve(self, index: int, token: int) -> None:
        self.output_ids[index] = token
        self.unsent_ids.append(token)
        self.num_resolved = index + 1

    def drop_reserved(self) -> None:
        """Forget tokens still on their way (the sequence finished before they arrived)."""
        del self.output_ids[self.num_resolved :]

    def tokens(self, start: int, n: int) -> list[int]:
        """Tokens start .. start+n-1 of prompt + output (without building the whole list)."""
        p = len(self.prompt_ids)
        if start >= p:
            return self.output_ids[start - p : start - p + n]
        if start + n <= p:
            return self.prompt_ids[start : start + n]
        return self.prompt_ids[start:] + self.output_ids[: start + n - p]


class GeneratorEngine(EngineLoop):
    def __init__(
        self,
        runner: DecoderRunner,
        tokenizer: TextTokenizer,
        sink: ResponseSink,
        scheduler: IterationScheduler,
        max_queue: int = 256,
        cancel_check_interval_s: float = 0.05,
        stream_interval: int = 1,
        max_stream_responses_per_s: float = 1000.0,
        stats: GeneratorStats | None = None,
    ):
        super().__init__("tritonformer-generator", max_queue)
        if scheduler.max_decode_steps > MAX_DECODE_STEPS:  # the runner holds this many iterations' ids
            raise ValueError(f"max_decode_steps must be <= {MAX_DECODE_STEPS}, got {scheduler.max_decode_steps}")
        self.runner = runner
        self.config = runner.model.config
        self.tokenizer = tokenizer
        self.sink = sink
        self.scheduler = scheduler
        self.grammars = prepare_grammars(tokenizer, runner.model.vocab_size, tuple(self.config.eos_token_ids))
        self.sampler = Sampler(self.config.eos_token_ids, grammars=self.grammars)
        self._awaiting_grammars: list[Sequence] = []  # constrained requests, until the grammar engine is up
        self.cancel_check_interval_s = cancel_check_interval_s
        # Stream a response every `stream_interval` tokens (the last always goes at once):
        # fewer, larger responses when each send's IPC cost matters more than smoothness.
        self.stream_interval = max(1, stream_interval)
        # Streamed responses per second across all streams, at most (see _due).
        self.max_stream_responses_per_s = max_stream_responses_per_s
        self.stats = stats
        self._last_cancel_check = 0.0
        self._cancel_cursor = 0  # where the next round of cancellation checks starts
        self._launched: _Launched | None = None  # the iteration on the GPU, tokens not yet read

    def new_sequence(self, handle, prompt_ids: list[int], params: SamplingParams, stream: bool,
                     options: ResponseOptions = ResponseOptions()) -> Sequence:
        """The request's sequence; with n > 1 the first of its samples, the others in `forks`
        (they share its prompt's KV blocks; each draws from its own noise stream)."""
        max_output = min(params.max_tokens, self.config.max_position_embeddings - len(prompt_ids))

        def sample(index: int) -> Sequence:
            p = params if index == 0 or params.seed is None else replace(params, seed=sample_seed(params.seed, index))
            return Sequence(handle, prompt_ids, p, stream, IncrementalDetokenizer(self.tokenizer, p.stop),
                            max_output=max_output, options=options, index=index,
                            one_step=p.structured is not None)

        first = sample(0)
        if params.n > 1:
            first.forks = [sample(i) for i in range(1, params.n)]
            group = RequestGroup(params.n)
            for seq in (first, *first.forks):
                seq.group = group
        return first

    # ---- EngineLoop ---------------------------------------------------------------------
    def admit(self, items: list[Sequence]) -> None:
        for seq in items:
            if seq.one_step and not self.grammars.wait(0):  # (its grammar needs the engine built first)
                self.grammars.start()
                self._awaiting_grammars.append(seq)
                continue
            try:  # (a structured output's grammar compiles here: a bad one fails this request only)
                for s in (seq, *seq.forks):
                    self.sampler.register(s.key, s.params, s.prompt_ids)
            except InvalidRequest as e:
                for s in (seq, *seq.forks):
                    self.sampler.release(s.key)
                self.reject(seq, e)
                continue
            self.scheduler.add(seq)
            if seq.forks:
                self.scheduler.add_forks(seq, seq.forks, len(seq.prompt_ids))

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._launched is not None or bool(self._awaiting_grammars)

    def num_queued(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.running) + len(self._awaiting_grammars)

    def reject(self, item: Sequence, error: Exception) -> None:
        self._send_error(item, error)

    def abort_all(self, error: Exception) -> None:
        while self.scheduler.running or self.scheduler.waiting:  # (a leader's release queues its forks)
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                self._release(seq)
                self._send_error(seq, error)
        for seq in self._awaiting_grammars:
            self._send_error(seq, error)
        self._awaiting_grammars = []
        self._launched = None
        self.report_occupancy()

    def step(self) -> None:
        """Launch the next iteration, then finish the one before it (see the module docstring).
        A sequence sampling under a grammar sits out an iteration while its last token is on its
        way to the host (its mask needs it: structured.py); the others run ahead as always."""
        self._drop_cancelled()
        if self._awaiting_grammars:
            idle = not self.scheduler.has_work() and self._launched is None
            if self.grammars.wait(0.05 if idle else 0):
                waited, self._awaiting_grammars = self._awaiting_grammars, []
                self.admit(waited)
        it = self.scheduler.schedule()
        previous, self._launched = self._launched, (self._launch(it) if it else None)
        if previous is not None:
            self._complete(previous)

    def _launch(self, it: Iteration) -> _Launched | None:
        work = it.all()
        entries = [BatchEntry(w.seq.tokens(w.start, w.num_new), w.start, w.seq.block_table, w.samples, w.seq.state_slot,
                              len(w.seq.prompt_ids)) for w in work]
        sampling = [w for w in work if w.samples]
        params, keys = [w.seq.params for w in sampling], [w.seq.key for w in sampling]
        try:
            if it.steps == 1:
                tokens = self.runner.sample(self.runner.run(entries), self.sampler, params, keys)
            else:
                tokens = self.runner.run_steps(entries, [w.steps for w in work], self.sampler, params, keys)
        except Exception as e:
            self._fail([w.seq for w in work], e)
            return None
        self.scheduler.commit(it)  # the KV is written before anything later on the stream reads it
        if it.steps == 1:
            self._stamp_admitted(it)  # (a round of several iterations never admits anyone)
            samples = [(w.seq, w.seq.reserve(row), 1) for row, w in enumerate(sampling)]
        else:
            samples = [(w.seq, w.seq.reserve_steps(row, w.steps), w.steps) for row, w in enumerate(sampling)]
        if self.stats is not None:
            self._report(it)
        return _Launched(samples, tokens)

    @staticmethod
    def _stamp_admitted(it: Iteration) -> None:
        """Note when each sequence's prompt first runs (its time in the queue is the first part
        of its time to first token); a preempted one that rejoins keeps its first time."""
        now = None
        for seq in it.admitted:
            if seq.scheduled_at is None:
                seq.scheduled_at = now = now or time.monotonic()

    def _complete(self, launched: _Launched) -> None:
        try:
            steps = launched.tokens.wait_steps()  # steps[j][row]: iteration j's token of that row
        except Exception as e:
            self._fail([seq for seq, _, _ in launched.samples if seq.finish_reason is None], e)
            return
        if len(steps) == 1:  # one iteration (the loop below, without its per-row inner loop)
            for (seq, index, _), token in zip(launched.samples, steps[0]):
                # (finish_reason set: it stopped, or was cancelled, after the launch)
                if seq.finish_reason is None and not self._take(seq, index, token) and seq.stream and self._due(seq):
                    self._send(seq, final=False)
            return
        for row, (seq, index, n) in enumerate(launched.samples):
            if seq.finish_reason is not None:
                continue
            for j in range(n):
                if self._take(seq, index + j, steps[j][row]):
                    break
            else:
                if seq.stream and self._due(seq):  # the round's tokens leave together
                    self._send(seq, final=False)

    def _fail(self, seqs: list[Sequence], error: Exception) -> None:
        log.exception("generation iteration failed")
        for seq in seqs:  # answer and drop them: they must not run (or fail) again
            seq.finish_reason = "error"  # and a token of theirs still on its way is ignored
            self._release(seq)
            self._send_error(seq, RuntimeError(f"generation failed: {error}"))
        self.report_occupancy()

    def _report(self, it: Iteration) -> None:
        if it.steps == 1:
            self.stats.iteration_done(tokens=it.num_tokens, preempted=len(it.preempted))
            if it.cache_lookups:
                self.stats.prefix_cache_lookups(queries=len(it.cache_lookups),
                                                hits=sum(1 for n in it.cache_lookups if n),
                                                hit_tokens=sum(it.cache_lookups))
        else:  # each iteration of the round: the sequences that still take part in it
            for j in range(it.steps):
                self.stats.iteration_done(tokens=sum(w.steps > j for w in it.decode), preempted=0)
        self.report_occupancy()

    def report_occupancy(self) -> None:
        """Gauges of what the engine holds; also after sequences leave without an iteration
        (cancelled, failed), or they would show the last iteration's values while idle."""
        if self.stats is None:
            return
        blocks = self.scheduler.blocks
        self.stats.occupancy(
            running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
            kv_blocks_used=blocks.num_used, kv_blocks_free=blocks.num_free,
            kv_bytes=blocks.num_used * self.runner.cache.bytes_per_block(),
        )

    # ---- per-sequence bookkeeping -------------------------------------------------------
    def _take(self, seq: Sequence, index: int, token: int) -> bool:
        """Output token `index` of `seq` arrived: record it, and finish the sequence if it stops
        there (returns whether it did)."""
        if seq.first_token_at is None:
            seq.first_token_at = time.monotonic()
        seq.resolve(index, token)
        p = seq.params
        if p.structured is not None:
            self.sampler.accept(seq.key, token)
        if p.logprobs is not None:
            seq.logprobs.append(self.sampler.take_logprobs(seq.key, p.logprobs))
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.config.eos_token_ids):
            seq.finish_reason = "stop"
        elif seq.detok.add(token):
            seq.finish_reason = "stop"  # a stop string appeared
        elif index + 1 >= seq.max_output:
            seq.finish_reason = "length"
        else:
            return False
        self._finish(seq)
        return True

    def _due(self, seq: Sequence) -> bool:
        """Whether `seq`'s pending tokens leave now as one streamed response: at least
        `stream_interval` of them, and (after the first piece, which goes at once for the time to
        first token) at least len(running) / max_stream_responses_per_s seconds since its last
        response. Every response is an IPC call in Triton's stub plus a detokenization here; at
        one per token per stream they cost more than the iterations themselves (through the
        server, 256 gpt2 streams: 18 ms per output token at one response per token, 6.5 ms at one
        per 8). The budget keeps the total response rate under what the stub can send, whatever
        the number of streams; with few streams it changes nothing."""
        if len(seq.unsent_ids) < self.stream_interval:
            return False
        if seq.last_sent_at is None:
            return True
        gap = len(self.scheduler.running) / self.max_stream_responses_per_s
        return time.monotonic() - seq.last_sent_at >= gap

    def _send(self, seq: Sequence, final: bool) -> None:
        """One response of `seq`: its new text and ids (streaming) or the whole completion; the
        finish reason when `final` (its last); the outputs its request asked for. `final` is
        the sequence's last response; the request's FINAL flag goes on the last of its n."""
        if seq.stream:
            text, ids = seq.detok.take_delta(final), seq.unsent_ids
            logprobs = seq.logprobs[seq.logprobs_sent :]
        else:
            text, ids, logprobs = seq.detok.text, seq.output_ids, seq.logprobs
        if not final and not text:
            return  # nothing readable yet (e.g. half a UTF-8 character): wait for more tokens
        group = seq.group
        if group is not None and group.closed:
            return  # another sample of the request failed, and its error ended the request
        if seq.options.echo_prompt is not None and seq.echo_pending:
            text = seq.options.echo_prompt + text
            seq.echo_pending = False
        outputs = {
            "text_output": np.array([text.encode("utf-8")], dtype=np.object_),
            "output_ids": np.array(ids, dtype=np.int32),
        }
        if final:
            outputs["finish_reason"] = np.array([seq.finish_reason.encode()], dtype=np.object_)
        o = seq.options
        if o.num_input_tokens or o.num_output_tokens or o.logprobs or group is not None:
            outputs.update(extra_outputs(
                o, len(seq.prompt_ids), len(ids), logprobs if seq.params.logprobs is not None else None,
                self._decode_token, seq.index if group is not None else None))
        seq.unsent_ids = []
        seq.logprobs_sent = len(seq.logprobs)
        seq.last_sent_at = time.monotonic()
        self.sink.send(seq.handle, outputs, None, final=final and (group is None or group.leave()))

    def _decode_token(self, token: int) -> str:
        """One token's text, as a `logprobs` entry shows it (special tokens included)."""
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _send_error(self, seq: Sequence, error: Exception) -> None:
        """Answer `seq`'s request with an error (once per request: n > 1 samples share it)."""
        if seq.group is not None:
            if seq.group.closed:
                return
            seq.group.closed = True
        self.sink.send(seq.handle, None, error, final=True)

    def _finish(self, seq: Sequence) -> None:
        seq.drop_reserved()
        self._release(seq)
        self._send(seq, final=True)
        if self.stats is not None:
            self.report_occupancy()  # before the request counts, so gauges never lag the counters
            n, first = len(seq.output_ids), seq.first_token_at
            ttft = first - seq.arrival if first is not None else None
            tpot = (time.monotonic() - first) / (n - 1) if first is not None and n > 1 else None
            wait = seq.scheduled_at - seq.arrival if seq.scheduled_at is not None else None
            self.stats.request_done(ttft=ttft, tpot=tpot, output_tokens=n, queue_wait=wait)

    def _release(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)  # frees its KV blocks at once
        self.sampler.release(seq.key)

    def _drop_cancelled(self) -> None:
        # Each cancellation check is an IPC round trip to the server (~0.06 ms): check every
        # cancel_check_interval_s, not per token, and at most CANCEL_CHECKS_PER_S sequences a
        # second, round-robin (256 streams checked every 50 ms would spend a third of this
        # thread's time asking). A cancelled request then stops within
        # max(interval, sequences / CANCEL_CHECKS_PER_S) seconds.
        now = time.monotonic()
        if now - self._last_cancel_check < self.cancel_check_interval_s:
            return
        self._last_cancel_check = now
        seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
        if not seqs:
            return
        quota = max(1, int(CANCEL_CHECKS_PER_S * max(self.cancel_check_interval_s, 0.001)))
        start = self._cancel_cursor % len(seqs)
        checked = (seqs[start:] + seqs[:start])[:quota]
        self._cancel_cursor = start + len(checked)
        dropped = False
        for seq in checked:
            if seq.group is not None and seq.group.closed:
                # Another sample's error ended the request: its final response is sent, after
                # which Triton frees the request, and asking about it would read freed memory.
                seq.finish_reason = "error"
                self._release(seq)
                dropped = True
            elif self.sink.is_cancelled(seq.handle):
                seq.finish_reason = "cancelled"
                self._finish(seq)
                dropped = True
        if dropped:
            self.report_occupancy()
