"""`bench tensor-parallel` on the CPU: its options, which sizes run, how profiled kernels are
counted, the seeded weights that make every split the same model, and a whole small run of the
steps, trace (with replicas) and agree parts over gloo, each configuration in its own process."""
from __future__ import annotations

import json

import pytest
import torch

from tritonformer.client import bench_tensor_parallel as bench
from tritonformer.client.cli import build_parser
from tritonformer.client.model_shapes import DECODER_SHAPES, seeded_shard_state


def _args(*extra: str):
    return build_parser().parse_args(["bench", "tensor-parallel", *extra])


def test_options_and_their_defaults():
    args = _args()
    defaults = (args.parts, args.allreduce, args.sizes, args.replicas, args.kv_fraction)
    assert defaults == ("steps", "auto", "1,2", None, 0.5)
    assert _args("--replicas").replicas == "sizes"
    args = _args("--replicas", "2,4", "--parts", "agree,steps", "--allreduce", "nccl,auto", "--kv-fraction", "0.4")
    assert args.replicas == "2,4" and args.kv_fraction == 0.4
    assert bench.parse_choices(args.parts, bench.PARTS, "part") == ["agree", "steps"]
    assert bench.parse_choices(args.allreduce, bench.ALLREDUCE, "all-reduce") == ["nccl", "auto"]
    assert bench.parse_ints("1,2,2,4") == [1, 2, 4]
    with pytest.raises(SystemExit, match="unknown all-reduce ring"):
        bench.parse_choices("nccl,ring", bench.ALLREDUCE, "all-reduce")
    with pytest.raises(SystemExit, match="unknown part"):
        bench.parse_choices("steps,served", bench.PARTS, "part")
    with pytest.raises(SystemExit, match="unknown --model"):
        bench.model_config("llama-9000")
    assert bench.model_config("tiny:llama-3.1-8b")["num_hidden_layers"] == 2


def test_sizes_beyond_the_gpus_or_the_heads_are_skipped_with_a_note():
    runnable, notes = bench.plan_sizes([1, 2, 4, 8], 4, DECODER_SHAPES["llama-3.1-70b"])
    assert runnable == [1, 2, 4] and len(notes) == 1 and "needs 8 GPUs, 4 here" in notes[0]
    runnable, notes = bench.plan_sizes([1, 2, 4, 8], None, DECODER_SHAPES["qwen2.5-7b"])  # 28 heads, 4 KV heads
    assert runnable == [1, 2, 4] and "28 attention heads do not divide by 8" in notes[0]
    assert bench.plan_sizes([1, 2, 4, 8], 8, DECODER_SHAPES["llama-3.1-8b"]) == ([1, 2, 4, 8], [])
    assert bench.plan_sizes([1, 2], 2, DECODER_SHAPES["falcon-mamba-7b"]) == ([1, 2], [])  # no attention heads
    assert bench.replica_counts(None, [1, 2, 4], 4) == ([], [])
    assert bench.replica_counts("sizes", [1, 2, 4], 4) == ([2, 4], [])
    counts, notes = bench.replica_counts("2,8", [1, 2], 4)
    assert counts == [2] and "needs 8 GPUs" in notes[0]


def test_profiled_kernels_are_counted_by_kind():
    names = {
        "ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "all_reduce",
        "ncclKernel_AllReduce_RING_LL_Sum_half(ncclWorkElem)": "all_reduce",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 2>(...)": "all_reduce",
        "_all_reduce_kernel": "all_reduce",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "collective",
        "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "collective",
        "_prenorm_gemv_kernel": "compute",
        "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64": "compute",
    }
    assert {n: bench.kernel_kind(n) for n in names} == names
    kernels = [(n, 10.0) for n in names] * 2  # two iterations' worth
    t = bench.collective_times(kernels, 2)
    assert t == {"kernel_us": 80.0, "all_reduce_us": 40.0, "all_reduce_count": 4.0, "collective_us": 20.0,
                 "collective_count": 2.0}


def test_profiled_kernels_are_ranked_by_time_per_iteration():
    kernels = [("gemv", 3.0), ("attention", 5.0), ("gemv", 4.0), ("x" * 80, 1.0)] * 2
    top = bench.top_kernels(kernels, 2, count=2)
    assert top == [["gemv", 7.0, 2.0], ["attention", 5.0, 1.0]]
    assert bench.top_kernels(kernels, 2)[-1][0] == "x" * bench.NAME_CHARS


def test_prefill_rows_print_their_ratio_to_one_gpu_and_the_profiled_all_reduce_share():
    common = {"part": "prefill", "model": "m", "tokens": 4096, "prompts": 8, "steps_each": 1.0}
    rows = [{**common, "tp": 1, "allreduce": "-", "ms": 100.0, "tok_per_s": 40960.0},
            {**common, "tp": 2, "allreduce": "auto", "ms": 60.0, "tok_per_s": 68267.0, "kernel_us": 50000.0,
             "all_reduce_us": 5000.0, "all_reduce_count": 65.0, "top": [["ncclDevKernel_AllReduce", 5000.0, 65.0]]}]
    text = "\n".join(bench.tables({"rows": rows, "context": 512}, "m"))
    assert "8 prompts of 512 tokens, 4096 tokens" in text
    assert "| m | 1 | - | 100.00 | 40,960 | - | 1 | - | - |" in text
    assert "| m | 2 | auto | 60.00 | 68,267 | 0.60x | 1 | 5000 (65) | 10.0% |" in text
    assert "| `ncclDevKernel_AllReduce` | 5000.0 | 65 |" in text


def test_token_comparison_names_the_first_divergence():
    same = bench.compare_tokens([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]])
    assert same == {"identical": True, "first_divergence": None, "identical_fraction": 1.0}
    parted = bench.compare_tokens([[1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3], [4, 9, 6, 7]])
    assert not parted["identical"] and parted["first_divergence"] == (1, 1)
    assert parted["identical_fraction"] == pytest.approx(6 / 7)


def test_replicas_merge_over_the_slowest_and_every_request():
    a = {"useful_tokens": 100, "seconds": 2.0, "ttft_ms": [1.0, 2.0], "preemptions": 1}
    b = {"useful_tokens": 60, "seconds": 4.0, "ttft_ms": [3.0, 4.0], "preemptions": 0}
    m = bench.merge_replicas([a, b])
    assert m["tok_per_s"] == 40.0 and m["requests"] == 4 and m["preemptions"] == 1
    assert m["ttft_p50_ms"] == 2.5


def test_seeded_weights_are_one_whole_model_whatever_part_is_read():
    cfg = bench.model_config("tiny:llama-3.1-8b")
    a, b = seeded_shard_state(cfg, 0, "cpu"), seeded_shard_state(cfg, 0, "cpu")
    name = "layers.1.mlp.down_proj.weight"
    whole = a[name][:]
    torch.testing.assert_close(b[name][:, 16:48], whole[:, 16:48], rtol=0, atol=0)  # a rank's columns
    q = "layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(a[q][32:64], b[q].to()[32:64], rtol=0, atol=0)  # a rank's rows; the whole via .to()
    assert not torch.equal(seeded_shard_state(cfg, 1, "cpu")[name][:], whole)
    assert not torch.equal(a["layers.0.mlp.down_proj.weight"][:], whole)  # each tensor its own values
    assert 0.015 < whole.std().item() < 0.025
    embed = "embed_tokens.weight"  # 320 rows: a part across two row blocks, made in the model's dtype
    rows = a[embed].SEED_ROWS
    assert a[embed].shape[0] > rows
    half = seeded_shard_state(cfg, 0, "cpu", "float16")[embed][rows - 8:rows + 8]
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, a[embed][:][rows - 8:rows + 8].half(), rtol=0, atol=0)


def _task(parts=("steps",), **overrides) -> dict:
    args = _args("--device", "cpu", "--dtype", "float32", "--model", "tiny:llama-3.1-8b", "--context", "32",
                 "--steps", "4", "--trace-requests", "4", "--agree-tokens", "8", "--prefill-tokens", "96",
                 "--prefill-repeats", "2")
    return {**bench._task(args, args.model, bench.model_config(args.model), 1, list(parts), [1, 3]), **overrides}


def test_steps_prefill_trace_and_agree_measure_an_engine_in_this_process():
    """The parts as a configuration's process runs them, here on a one-rank engine."""
    task = _task(parts=["steps", "prefill", "trace", "agree"])
    assert task["max_running"] >= 3  # the prefill's 3 prompts run at once
    engine, workers = bench.build(task)
    out = bench.measure(engine, task, {})
    assert workers is None and set(out["steps"]) == {1, 3} and all(ms > 0 for ms in out["steps"].values())
    prefill = out["prefill"]
    assert (prefill["tokens"], prefill["prompts"]) == (96, 3) and prefill["ms"] > 0 and prefill["tok_per_s"] > 0
    assert prefill["steps_each"] >= 1 and "kernel_us" not in prefill  # no profile on the CPU
    assert out["trace"]["requests"] == 4 and out["trace"]["tok_per_s"] > 0 and len(out["trace"]["ttft_ms"]) == 4
    assert [len(t) for t in out["agree"]["tokens"]] == [8, 8, 8]
    assert out["agree"]["logits"].shape == (3, engine.runner.model.vocab_size)
    assert not engine.has_work() and not engine.sink.errors


def test_fp8_builds_fp8_linears_and_the_floor_counts_their_bytes():
    from tritonformer.client.gpu_measure import read_bytes_per_step
    from tritonformer.kernels.fp8 import Fp8Weight

    plain, _ = bench.build(_task())
    fp8, _ = bench.build(_task(quantization="fp8"))
    plain, fp8 = plain.runner.model, fp8.runner.model
    names = type(fp8).LINEAR_WEIGHTS
    assert all(isinstance(getattr(layer, n), Fp8Weight) for layer in fp8.layers for n in names)
    sixteen = sum(getattr(layer, n).numel() * getattr(layer, n).element_size() for layer in plain.layers for n in names)
    eight = sum(getattr(layer, n).nbytes() for layer in fp8.layers for n in names)
    assert read_bytes_per_step(fp8) == read_bytes_per_step(plain) - sixteen + eight and eight < sixteen / 3


@pytest.mark.slow
def test_a_small_run_over_gloo_splits_replicates_and_agrees(tmp_path, capsys, monkeypatch):
    """Trace (beside two replicas), prefill and agree at TP 1 and 2 of a 2-layer Llama in fp32 on the
    CPU, each configuration a process; TP 4 is skipped (2 KV heads). The split model is the
    one-rank model: same tokens, same logits."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the processes run the references, as on a CPU host
    out = tmp_path / "tp.json"
    code = bench.run(_args("--device", "cpu", "--dtype", "float32", "--model", "tiny:llama-3.1-8b", "--sizes", "1,2,4",
                           "--parts", "trace,agree,prefill", "--replicas", "2", "--trace-requests", "2",
                           "--agree-tokens", "8", "--prefill-tokens", "64", "--prefill-repeats", "1", "--json", str(out)))
    assert code == 0
    results = json.loads(out.read_text())
    rows = results["rows"]
    trace = {r["serving"]: r for r in rows if r["part"] == "trace"}
    assert set(trace) == {"TP=1", "TP=2", "TP=1 x2 replicas"}
    assert trace["TP=2"]["allreduce"] == "auto" and trace["TP=1 x2 replicas"]["gpus"] == 2
    assert all(r["useful_tokens"] == trace["TP=1"]["useful_tokens"] and r["tok_per_s"] > 0 for r in trace.values())
    assert all(r["requests"] == 2 and r["ttft_p99_ms"] >= r["ttft_p50_ms"] > 0 for r in trace.values())
    prefill = {r["tp"]: r for r in rows if r["part"] == "prefill"}
    assert set(prefill) == {1, 2} and all(r["tokens"] == 64 and r["ms"] > 0 for r in prefill.values())
    (agree,) = [r for r in rows if r["part"] == "agree"]
    assert (agree["tp"], agree["against"], agree["identical"]) == (2, 1, True)
    assert agree["argmax_equal_step0"] and agree["max_logit_diff_step0"] < 1e-4
    (note,) = results["notes"]  # (another would say a configuration's process missed the all-reduce switch)
    assert "TP=4 skipped: its 2 KV heads do not divide by 4" in note
    assert "TP=1 x2 replicas" in capsys.readouterr().out


def test_a_configuration_past_its_timeout_is_stopped_and_reported(tmp_path):
    out = tmp_path / "tp.json"
    code = bench.run(_args("--device", "cpu", "--dtype", "float32", "--model", "tiny:llama-3.1-8b", "--sizes", "2",
                           "--timeout", "0.5", "--json", str(out)))
    assert code == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["part"] == "skipped" and "timed out" in row["why"]


def test_a_part_that_fails_keeps_what_was_measured_before_it(monkeypatch):
    import queue

    def fail(engine, trace):
        raise RuntimeError("CUDA out of memory. Tried to allocate 224.00 MiB")

    monkeypatch.setattr(bench, "timed_trace", fail)
    results = queue.Queue()
    bench.configuration_main(_task(parts=["steps", "trace"], batches=[1]), results)
    kind, out = results.get_nowait()
    assert kind == "done" and set(out["steps"]) == {1} and "trace" not in out
    assert out["failed"]["oom"] and "RuntimeError" in out["failed"]["message"]


def test_with_fp8_every_size_is_also_set_against_the_16_bit_model():
    """agreement() with the 16-bit TP=1 reference that --quantization fp8 adds: each FP8 size
    (TP=1 too) gets a row against it, the reference none of its own."""
    import numpy as np

    logits = np.array([[0.0, 1.0, 0.5]])
    outputs = {(1, None): {"tokens": [[1, 2]], "logits": logits},
               (2, "auto"): {"tokens": [[1, 0]], "logits": logits + [[0.0, 0.0, 0.7]]},
               (1, bench.SIXTEEN_BIT): {"tokens": [[1, 2]], "logits": logits + 0.25}}
    results = {"rows": [], "notes": []}
    bench.agreement("m", outputs, results)
    got = {(r["tp"], r["against"], r["against_allreduce"]): (r["identical"], r["argmax_equal_step0"],
                                                           round(r["max_logit_diff_step0"], 4))
           for r in results["rows"]}
    assert got == {(2, 1, "-"): (False, False, 0.7), (1, 1, "16-bit"): (True, True, 0.25),
                   (2, 1, "16-bit"): (False, False, 0.45)}
    assert "TP=1 (16-bit)" in "\n".join(bench.tables({**results, "context": 1, "agree_tokens": 2}, "m"))


def test_trace_rows_split_their_time_by_phase_against_one_gpu():
    def phases(prefill, rounds):
        return {"prefill": {"seconds": prefill, "launches": 19, "iterations": 19},
                "round": {"seconds": rounds, "launches": 30, "iterations": 120},
                "single decode": {"seconds": 0.0, "launches": 0, "iterations": 0}}

    common = {"part": "trace", "model": "m", "replicas": 1, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0}
    rows = [{**common, "tp": 1, "allreduce": "-", "serving": "TP=1", "gpus": 1, "tok_per_s": 1000.0,
             "phases": phases(2.0, 1.0)},
            {**common, "tp": 2, "allreduce": "auto", "serving": "TP=2", "gpus": 2, "tok_per_s": 1500.0,
             "phases": phases(1.2, 0.8)},
            {**common, "tp": 1, "allreduce": "-", "serving": "TP=1 x2 replicas", "replicas": 2, "gpus": 2,
             "tok_per_s": 1800.0}]
    lines = bench._trace_table("m", rows, {"trace_requests": 256})
    by_phase = [line for line in lines if "by phase" in line]
    assert len(by_phase) == 2  # the replicas' row has no phases of one engine
    assert by_phase[0] == "- TP=1 (-) by phase: prefill 2.000 s in 19 launches (19 iterations); " \
                          "round 1.000 s in 30 launches (120 iterations)"
    assert "prefill 1.200 s in 19 launches (19 iterations, 0.60x TP=1's)" in by_phase[1]
    assert "round 0.800 s in 30 launches (120 iterations, 0.80x TP=1's)" in by_phase[1]
    assert "single decode" not in by_phase[1]  # phases without a launch are left out


def test_the_benchmark_offers_every_all_reduce_mode():
    from tritonformer.backend.parallel.allreduce import MODES

    assert set(bench.ALLREDUCE) == set(MODES)
