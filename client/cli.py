"""The `tritonformer` command: serve, embed, generate.

    tritonformer serve                      start the bundled tritonserver on model_repository/
    tritonformer embed "a text" "another"   sentence embeddings (HTTP or gRPC)
    tritonformer generate "prompt" --stream stream a completion (gRPC streaming)
    tritonformer health                     is every model really answering? (probes)
    tritonformer rerank "a query" "text" "another text"   relevance scores, best first (reranker)
    tritonformer classify "a text" "another"   label and probabilities per text (classifier)
    tritonformer bench runtime              encoder runtime vs Hugging Face (GPU)
    tritonformer bench serve-decoder --in-process   decoder engine vs Hugging Face (GPU)
    tritonformer bench load embed --rates 1000,2000   open-loop load through a running server
    tritonformer bench openai               the OpenAI routes vs direct gRPC, through a running server
    tritonformer bench tensor-parallel      a decoder split over this host's GPUs vs one GPU (GPUs)
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _default_url(protocol: str) -> str:
    if protocol == "grpc":
        return f"127.0.0.1:{os.environ.get('TRITONFORMER_GRPC_PORT', '8001')}"
    return f"127.0.0.1:{os.environ.get('TRITONFORMER_HTTP_PORT', '8000')}"


def _cmd_embed(args) -> int:
    from tritonformer.client.calls import embed

    url = args.url or _default_url(args.protocol)
    vectors = embed(args.texts, url=url, protocol=args.protocol, model=args.model, truncate=args.truncate)
    for text, vec in zip(args.texts, vectors):
        if args.full:
            print(json.dumps({"text": text, "embedding": [round(float(x), 6) for x in vec]}))
        else:
            head = ", ".join(f"{x:+.4f}" for x in vec[:6])
            print(f"[{head}, ...] dim={len(vec)}  {text[:60]!r}")
    return 0


def _cmd_rerank(args) -> int:
    from tritonformer.client.calls import rerank

    url = args.url or _default_url(args.protocol)
    scores = rerank(args.query, args.texts, url=url, protocol=args.protocol, model=args.model,
                    truncate=args.truncate, raw_scores=args.raw_scores)
    for i in sorted(range(len(scores)), key=lambda i: -scores[i]):  # best first; the index is the text's
        print(f"{scores[i]:+.4f}  [{i}] {args.texts[i][:70]!r}")
    return 0


def _cmd_classify(args) -> int:
    from tritonformer.client.calls import classify

    url = args.url or _default_url(args.protocol)
    probabilities, labels = classify(args.texts, url=url, protocol=args.protocol, model=args.model,
                                     truncate=args.truncate)
    for text, label, row in zip(args.texts, labels, probabilities):
        print(f"{label}  p={row.max():.4f}  {text[:70]!r}")
    return 0


def _cmd_generate(args) -> int:
    from tritonformer.client.calls import generate

    params = {"max_tokens": args.max_tokens, "temperature": args.temperature, "apply_chat_template": args.chat}
    for key in ("top_k", "top_p", "seed"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    if args.stop:
        params["stop"] = args.stop
    url = args.url or _default_url("grpc")
    finish = None
    for piece in generate(args.prompt, url=url, model=args.model, stream=args.stream, sampling_parameters=params):
        sys.stdout.write(piece.text)
        sys.stdout.flush()
        finish = piece.finish_reason or finish
    sys.stdout.write("\n")
    if finish:
        print(f"[finish_reason: {finish}]", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from tritonformer.client.serve import add_serve_arguments

    parser = argparse.ArgumentParser(prog="tritonformer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start tritonserver with model_repository/ in the foreground")
    add_serve_arguments(serve)

    embed = sub.add_parser("embed", help="embed texts with the embedder model")
    embed.add_argument("texts", nargs="+", metavar="TEXT")
    embed.add_argument("--protocol", choices=("http", "grpc"), default="http")
    embed.add_argument("--url", help="host:port (default 127.0.0.1 and $TRITONFORMER_HTTP_PORT / $TRITONFORMER_GRPC_PORT)")
    embed.add_argument("--model", default="embedder")
    embed.add_argument("--truncate", action="store_true", help="truncate texts longer than the model's maximum")
    embed.add_argument("--full", action="store_true", help="print whole vectors as JSON lines")
    embed.set_defaults(func=_cmd_embed)

    rr = sub.add_parser("rerank", help="score texts against a query with the reranker model")
    rr.add_argument("query")
    rr.add_argument("texts", nargs="+", metavar="TEXT")
    rr.add_argument("--raw-scores", action="store_true", help="the head's logits instead of their sigmoid")
    cl = sub.add_parser("classify", help="label texts with the classifier model")
    cl.add_argument("texts", nargs="+", metavar="TEXT")
    for p, model, func in ((rr, "reranker", _cmd_rerank), (cl, "classifier", _cmd_classify)):
        p.add_argument("--protocol", choices=("http", "grpc"), default="http")
        p.add_argument("--url", help="host:port (default 127.0.0.1 and $TRITONFORMER_HTTP_PORT / $TRITONFORMER_GRPC_PORT)")
        p.add_argument("--model", default=model)
        p.add_argument("--truncate", action="store_true", help="cut inputs longer than the model's maximum")
        p.set_defaults(func=func)

    gen = sub.add_parser("generate", help="generate text with the generator model (gRPC streaming)")
    gen.add_argument("prompt")
    gen.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--url", help="gRPC host:port (default 127.0.0.1:$TRITONFORMER_GRPC_PORT or 8001)")
    gen.add_argument("--model", default="generator")
    gen.set_defaults(func=_cmd_generate)

    health = sub.add_parser("health", help="send each model a tiny real request (for liveness/readiness probes)")
    from tritonformer.client import health as health_cmd

    health_cmd.add_arguments(health)
    health.set_defaults(func=health_cmd.run)

    bench = sub.add_parser("bench", help="benchmarks (GPU): baseline and ours from one run")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    runtime = bench_sub.add_parser("runtime", help="encoder runtime vs Hugging Face BertModel (eager, SDPA)")
    from tritonformer.client import bench_runtime

    bench_runtime.add_arguments(runtime)
    runtime.set_defaults(func=bench_runtime.run)
    serve_encoder = bench_sub.add_parser("serve-encoder", help="encoder batching policies under open-loop Poisson load")
    from tritonformer.client import bench_serve_encoder

    bench_serve_encoder.add_arguments(serve_encoder)
    serve_encoder.set_defaults(func=bench_serve_encoder.run)
    serve_decoder = bench_sub.add_parser("serve-decoder", help="decoder engine vs Hugging Face generate / continuous batching")
    from tritonformer.client import bench_serve_decoder

    bench_serve_decoder.add_arguments(serve_decoder)
    serve_decoder.set_defaults(func=bench_serve_decoder.run)
    tp_bench = bench_sub.add_parser("tensor-parallel", help="a decoder split over this host's GPUs vs one GPU")
    from tritonformer.client import bench_tensor_parallel

    bench_tensor_parallel.add_arguments(tp_bench)
    tp_bench.set_defaults(func=bench_tensor_parallel.run)
    openai_bench = bench_sub.add_parser(
        "openai", help="the OpenAI routes vs direct gRPC streaming: tokens/s at saturation, TTFT p50 at 8 req/s")
    from tritonformer.client import bench_openai

    bench_openai.add_arguments(openai_bench)
    openai_bench.set_defaults(func=bench_openai.run)
    load = bench_sub.add_parser(
        "load", add_help=False,
        help="open-loop Poisson load over HTTP against a running server: embed | generate | capacity (--help)",
    )
    load.add_argument("load_args", nargs=argparse.REMAINDER)
    load.set_defaults(func=_cmd_load)
    return parser


def _cmd_load(args) -> int:
    from tritonformer.client import loadgen

    return loadgen.main(args.load_args, prog="tritonformer bench load")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from tritonformer.client.serve import run_serve

        return run_serve(args)
    try:
        return args.func(args)
    except Exception as e:  # tritonclient errors carry the server's message: show it plainly
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
