"""The OpenAI routes against direct gRPC streaming: same prompts, same output lengths, one run.

    python -m tritonformer.client.bench_openai --grpc-url 127.0.0.1:8001 --openai-url http://127.0.0.1:9000

Needs a running tritonserver with our generator and the OpenAI routes in front of it
(`tritonformer serve` starts both; or `python -m tritonformer.client.openai_routes`). For each of
two points it sends the Orca trace (prompts U[32,512] tokens, outputs U[1,128], seed 0) twice,
at the same open-loop Poisson arrivals: once straight to the generator over gRPC streaming
(`text_input`, `exclude_input_in_output` as the routes send it, tritonclient's asyncio client),
once to `/v1/completions` (streamed, greedy, `ignore_eos`, aiohttp). Both ways carry prompt
*text* of the trace's token counts (one-token words of the served tokenizer), so both tokenize
texts of the same lengths, and both generate exactly each request's `max_tokens`. Each way and
point gets texts of its own (the warm-up others again): the generator's prefix cache keeps the
KV blocks of every prompt it has computed, so a way sending prompts that another way had sent
would compute only their last tokens and skip the prefill work the other way paid for.

* saturation (`--saturation-rate`, default 1,000 req/s: every request at about once): output
  tokens/s; target: /v1 >= 95% of direct;
* low rate (`--low-rate`, 8 req/s): TTFT p50 from the scheduled arrival; target: /v1 within
  2 ms of direct.

It prints one Markdown table with both ways per point and the two ratios, and, where Triton's
metrics endpoint answers (`--metrics-url`), the generator's own mean time to first token and
prefix-cache hits per way: the client's TTFT minus the generator's is the transport's share.
The client runs both ways in this one process (its CPU share is in the table: near 1 core means
the client, not the server, sets the pace); the routes must run in another process. Statistics are loadgen's
(`summarize_generate`: latencies from the scheduled arrival, no coordinated omission).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time

import aiohttp
import numpy as np

from tritonformer.client.loadgen import Record, clock, poisson_schedule, summarize_generate
from tritonformer.client.traces import one_token_words, trace_texts

TARGET_THROUGHPUT_RATIO = 0.95
TARGET_TTFT_DELTA_MS = 2.0


# ------------------------------------------------------------------ the prompts


def served_tokenizer(grpc_url: str, model: str):
    """The generator's tokenizer, found from Triton's config as the OpenAI routes find it."""
    import tritonclient.grpc as grpcclient

    from tritonformer.backend.tokenization import TextTokenizer
    from tritonformer.client.openai_routes.served_models import generator_checkpoint, parameter

    with grpcclient.InferenceServerClient(grpc_url) as client:
        config = client.get_model_config(model, as_json=True)["config"]
    return TextTokenizer(generator_checkpoint(parameter(config, "checkpoint")))


# ------------------------------------------------------------------ the two ways


async def _direct_one(client, model: str, text: str, max_tokens: int, rec: Record) -> None:
    """One generation over gRPC streaming, timestamped as each response arrives."""
    import tritonclient.grpc as grpcclient

    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps(
        {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}).encode()], dtype=np.object_))
    # As the routes ask: no echo of the prompt before the completion (the vLLM contract's default).
    no_echo = grpcclient.InferInput("exclude_input_in_output", [1], "BOOL")
    no_echo.set_data_from_numpy(np.array([True]))
    done = asyncio.Event()

    async def request():
        yield {"model_name": model, "inputs": [prompt, params, no_echo]}
        await done.wait()

    rec.sent = clock()
    responses = client.stream_infer(request())
    try:
        async for result, error in responses:
            now = clock()
            if error is not None:
                rec.error = str(error)
                break
            ids = result.as_numpy("output_ids")
            count = 0 if ids is None else ids.size
            if count:
                if rec.tokens == 0:
                    rec.first = now
                rec.last_token, rec.tokens = now, rec.tokens + count
                rec.events.append((now, count))
            if result.as_numpy("finish_reason") is not None:
                rec.end, rec.status = now, 200
                break
    finally:
        done.set()
        if math.isnan(rec.end):
            responses.cancel()


async def _openai_one(session: aiohttp.ClientSession, url: str, model: str, text: str, max_tokens: int,
                      rec: Record) -> None:
    """One streamed /v1/completions: TTFT at the first chunk, tokens from the usage chunk."""
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    rec.sent = clock()
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            rec.status, rec.error, rec.end = resp.status, (await resp.text())[:300], clock()
            return
        buf = b""
        async for chunk in resp.content.iter_any():
            now = clock()
            buf += chunk
            while (nl := buf.find(b"\n")) >= 0:
                line, buf = buf[:nl].strip(), buf[nl + 1:]
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    rec.end, rec.status = now, 200
                    continue
                event = json.loads(data)
                if "error" in event:
                    rec.error = str(event["error"])
                if event.get("choices"):
                    if math.isnan(rec.first):
                        rec.first = now
                    rec.last_token = now
                    rec.events.append((now, 0))
                if event.get("usage"):
                    rec.tokens = event["usage"]["completion_tokens"]
    if rec.status == 200 and rec.tokens == 0:
        rec.error = "no usage chunk"


async def run_way(way: str, args, prompts: list[tuple[str, int, int]], rate: float, seed: int,
                  warm_up: list[tuple[str, int, int]]) -> dict:
    """Send every prompt at its Poisson arrival (open loop) one way, after the `warm_up` prompts
    (outside the clock); loadgen's summary of it, with the generator's view (server_view)."""
    import tritonclient.grpc.aio as aiogrpc

    offsets = poisson_schedule(rate, seed=seed, n=len(prompts))
    records = [Record(i, math.nan, n) for i, (_, n, _) in enumerate(prompts)]
    client = aiogrpc.InferenceServerClient(args.grpc_url) if way == "direct" else None
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=None)) if way == "openai" else None
    url = args.openai_url.rstrip("/") + "/v1/completions"

    async def one(k: int, prompt: tuple[str, int, int] | None = None) -> None:
        text, _, max_tokens = prompt or prompts[k]
        rec = records[k]
        rec.launched = clock()
        try:
            if way == "direct":
                await _direct_one(client, args.model, text, max_tokens, rec)
            else:
                await _openai_one(session, url, args.model, text, max_tokens, rec)
        except Exception as e:  # a failed request, counted beside the good ones
            rec.error, rec.end = f"{type(e).__name__}: {e}", clock()

    try:
        # Warm-up outside the clock: connections, and the first request of each kind (prompts
        # of their own: the measured ones must not find theirs in the prefix cache).
        warm = [asyncio.ensure_future(one(k, p)) for k, p in enumerate(warm_up[: len(prompts)])]
        await asyncio.gather(*warm)
        records[:] = [Record(i, math.nan, n) for i, (_, n, _) in enumerate(prompts)]
        await asyncio.sleep(0.5)  # the generator's metrics trail its answers
        before = server_metrics(args.metrics_url, args.model)  # (nothing in flight: a blocking call is fine)
        start = clock() + 0.05
        cpu0 = time.process_time()
        tasks = []
        for k, offset in enumerate(offsets):
            due = start + float(offset)
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            records[k].scheduled = due
            tasks.append(asyncio.ensure_future(one(k)))
        await asyncio.wait_for(asyncio.gather(*tasks), args.timeout)
        cpu = time.process_time() - cpu0
    finally:
        if client is not None:
            await client.close()
        if session is not None:
            await session.close()
    summary = summarize_generate(records, start, rate, 0.0, cpu)
    summary.update(way=way, expected_tokens=sum(m for _, _, m in prompts))
    if before is not None:
        time.sleep(0.5)
    summary.update(server_view(before, server_metrics(args.metrics_url, args.model)))
    return summary


# ------------------------------------------------------------------ the generator's own view

SERVER_METRICS = ("tritonformer_time_to_first_token_seconds_sum", "tritonformer_time_to_first_token_seconds_count",
                  "tritonformer_prompt_queue_seconds_sum", "tritonformer_prompt_queue_seconds_count",
                  "tritonformer_prefix_cache_hit_tokens_total")


def server_metrics(url: str | None, model: str) -> dict[str, float] | None:
    """SERVER_METRICS for `model` from Triton's metrics endpoint; None if it does not answer."""
    import urllib.request

    if not url:
        return None
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in SERVER_METRICS and f'model="{model}"' in rest:
            values[name] = float(line.rsplit(" ", 1)[1])
    return values


def server_view(before: dict | None, after: dict | None) -> dict:
    """The generator's mean TTFT and prompt queueing (ms) and prompt tokens taken from the prefix
    cache between two scrapes."""
    if not before or not after:
        return {"server_ttft_mean_ms": math.nan, "server_queue_mean_ms": math.nan, "cache_hit_tokens": math.nan}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SERVER_METRICS}

    def mean(stem: str) -> float:
        n = d[f"{stem}_count"]
        return d[f"{stem}_sum"] / n * 1e3 if n else math.nan

    return {"server_ttft_mean_ms": mean("tritonformer_time_to_first_token_seconds"),
            "server_queue_mean_ms": mean("tritonformer_prompt_queue_seconds"),
            "cache_hit_tokens": d["tritonformer_prefix_cache_hit_tokens_total"]}


# ------------------------------------------------------------------ the report


def _f(value, digits=1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def report(points: dict[str, dict[str, dict]], args) -> str:
    lines = ["| point | way | offered req/s | ok / requests | output tok/s | TTFT p50 ms | TTFT p99 ms | "
             "TPOT p50 ms | client CPU cores | server TTFT mean ms | server queue mean ms | prefix-cache hit tokens |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for point, ways in points.items():
        for way, s in ways.items():
            lines.append(f"| {point} | {way} | {_f(s['offered_rate'], 0)} | {s['ok']} / {s['requests']} | "
                         f"{_f(s['output_tok_per_s'], 0)} | {_f(s['ttft_p50_ms'], 2)} | {_f(s['ttft_p99_ms'], 2)} | "
                         f"{_f(s['tpot_p50_ms'], 2)} | {_f(s['client_cpu_cores'], 2)} | "
                         f"{_f(s.get('server_ttft_mean_ms'), 2)} | {_f(s.get('server_queue_mean_ms'), 2)} | "
                         f"{_f(s.get('cache_hit_tokens'), 0)} |")
    sat, low = points["saturation"], points["low rate"]
    ratio = sat["openai"]["output_tok_per_s"] / sat["direct"]["output_tok_per_s"] \
        if sat["direct"]["output_tok_per_s"] else math.nan
    delta = low["openai"]["ttft_p50_ms"] - low["direct"]["ttft_p50_ms"]
    lines += ["",
              f"tokens/s at saturation, /v1 / direct: {_f(ratio, 3)}x (target >= {TARGET_THROUGHPUT_RATIO}: "
              f"{'met' if ratio >= TARGET_THROUGHPUT_RATIO else 'missed'})",
              f"TTFT p50 at {_f(args.low_rate, 0)} req/s, /v1 - direct: {delta:+.2f} ms "
              f"(/v1 / direct {_f(low['openai']['ttft_p50_ms'] / low['direct']['ttft_p50_ms'], 3)}x; target <= "
              f"{TARGET_TTFT_DELTA_MS} ms: {'met' if delta <= TARGET_TTFT_DELTA_MS else 'missed'})"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grpc-url", default="127.0.0.1:8001", help="tritonserver gRPC (default: %(default)s)")
    parser.add_argument("--openai-url", default="http://127.0.0.1:9000", help="the OpenAI routes (default: %(default)s)")
    parser.add_argument("--model", default="generator")
    parser.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics",
                        help="Triton's metrics: the generator's own TTFT per way ('' skips; default: %(default)s)")
    parser.add_argument("--requests", type=int, default=256, help="trace requests per point and way (256)")
    parser.add_argument("--prompt-range", default="32,512", help="prompt tokens, uniform (32,512)")
    parser.add_argument("--output-range", default="1,128", help="output tokens, uniform (1,128)")
    parser.add_argument("--saturation-rate", type=float, default=1000.0)
    parser.add_argument("--low-rate", type=float, default=8.0)
    parser.add_argument("--low-requests", type=int, default=128, help="requests of the low-rate point (128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for one point and way")
    parser.add_argument("--json", help="write every summary here")


def run(args: argparse.Namespace) -> int:
    tokenizer = served_tokenizer(args.grpc_url, args.model)
    pair = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731

    words = one_token_words(tokenizer)

    def texts(k: int) -> list[tuple[str, int, int]]:  # the trace's lengths, words of their own
        return trace_texts(tokenizer, args.requests, args.seed, pair(args.prompt_range), pair(args.output_range),
                           text_seed=args.seed * 1000 + k, words=words)

    prompts = texts(0)
    print(f"Orca trace: {len(prompts)} requests, {sum(n for _, n, _ in prompts):,} prompt tokens, "
          f"{sum(m for _, _, m in prompts):,} output tokens (seed {args.seed})", file=sys.stderr)
    points: dict[str, dict[str, dict]] = {}
    plan = [("saturation", args.saturation_rate, args.requests), ("low rate", args.low_rate, args.low_requests)]
    k = 0
    for point, rate, count in plan:
        points[point] = {}
        for way in ("direct", "openai"):  # one after the other, same arrivals (same seed), texts of their own
            measured = prompts if k == 0 else texts(2 * k)
            warm_up = texts(2 * k + 1)[:4]
            k += 1
            summary = asyncio.run(run_way(way, args, measured[:count], rate, args.seed, warm_up))
            points[point][way] = summary
            print(f"{point} {way}: {summary['ok']}/{summary['requests']} ok, {summary['output_tok_per_s']:,.0f} tok/s, "
                  f"TTFT p50 {summary['ttft_p50_ms']:.2f} ms"
                  + (f", first error {summary['first_error']}" if summary["first_error"] else ""), file=sys.stderr)
    print(report(points, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "points": points}, f, indent=1, default=str)
    failed = any(s["ok"] < s["requests"] for ways in points.values() for s in ways.values())
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritonformer.client.bench_openai", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
