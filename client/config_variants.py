"""Variants of the shipped config.pbtxt files, for deployments, benchmarks and tests that want them.

`copy_model`: a model folder copied under another name, with other parameter values or another
instance count (a test's repository serving the generator twice, a soak's engine_process).

`with_triton_batching`: the embedder behind Triton's own batcher, used only to hand it several
requests per execute() call. Each call is an IPC round trip between the server and the model's
stub process (~0.1-0.2 ms): at one request per call, one instance tops out near 2,000 req/s
whatever the GPU does. With `max_batch_size` > 0, a zero-delay `dynamic_batching` and ragged
inputs, Triton passes every request queued meanwhile in one call; our queue still forms the
real batches. The price is the tensor shapes: every input and output gains a leading batch
dimension of 1 (`input_ids` [1, n], `text_input` [1, k], `embedding` [1, k, hidden]).
"""
from __future__ import annotations

import re

_RAGGED_INPUTS = ("text_input", "input_ids")


def with_triton_batching(config: str, max_batch_size: int = 64) -> str:
    """The embedder's config.pbtxt text, changed to run behind Triton's batcher."""
    text, n = re.subn(r"^max_batch_size: 0\s*$",
                      f"max_batch_size: {max_batch_size}\n"
                      "dynamic_batching { max_queue_delay_microseconds: 0 }  # no waiting: our queue batches",
                      config, flags=re.M)
    if n != 1:
        raise ValueError("expected one line 'max_batch_size: 0' in the embedder's config.pbtxt")
    for name in _RAGGED_INPUTS:  # requests of different lengths (or text counts) share a call
        text, n = re.subn(r'(\{ name: "' + name + r'"[^}]*?)\s*\}', r"\1 allow_ragged_batch: true }", text)
        if n != 1:
            raise ValueError(f"expected one input {name!r} in the embedder's config.pbtxt")
    return text


def with_parameters(config: str, parameters: dict[str, str] | None = None, name: str | None = None,
                    instances: int | None = None) -> str:
    """config.pbtxt text with parameters set (each must be in it already: a typo is an error, not
    a silently ignored key), the model renamed, and instance_group's count changed."""
    for key, value in (parameters or {}).items():
        config, n = re.subn(rf'(parameters \{{ key: "{key}" value: \{{ string_value: )"[^"]*"', rf'\1"{value}"', config)
        if n != 1:
            raise ValueError(f"expected one parameter {key!r} in the config")
    if name is not None:
        config, n = re.subn(r'^name: "[^"]*"', f'name: "{name}"', config, flags=re.M)
        if n != 1:
            raise ValueError("expected one line name: \"...\" in the config")
    if instances is not None:
        config, n = re.subn(r"instance_group \[ \{ count: \d+", f"instance_group [ {{ count: {instances}", config)
        if n != 1:
            raise ValueError("expected one instance_group [ { count: N ... } ] in the config")
    return config


def copy_model(source, target, parameters: dict[str, str] | None = None, name: str | None = None,
               instances: int | None = None):
    """Copy the model folder `source` to `target` (named for the folder unless `name` says
    otherwise), its config.pbtxt changed as with_parameters does. Returns `target` as a Path."""
    import shutil
    from pathlib import Path

    target = Path(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    config.write_text(with_parameters(config.read_text(), parameters, name if name is not None else target.name,
                                      instances))
    return target


def main(argv: list[str] | None = None) -> int:
    """python -m tritonformer.client.config_variants triton-batching CONFIG [MAX_BATCH]: rewrite in place."""
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] != "triton-batching":
        print(main.__doc__, file=sys.stderr)
        return 2
    path = Path(args[1])
    path.write_text(with_triton_batching(path.read_text(), int(args[2]) if len(args) == 3 else 64))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
