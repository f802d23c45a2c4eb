"""client/config_variants.py: the embedder's config.pbtxt behind Triton's batcher; a model folder
copied with other parameters, name and instance count."""
from __future__ import annotations

from pathlib import Path

import pytest

from tritonformer.client import config_variants

SHIPPED = Path(__file__).resolve().parent.parent / "model_repository" / "embedder" / "config.pbtxt"


def test_rewrites_the_shipped_config_and_leaves_the_rest(tmp_path):
    config = tmp_path / "config.pbtxt"
    config.write_text(SHIPPED.read_text())
    assert config_variants.main(["triton-batching", str(config), "32"]) == 0
    text = config.read_text()
    assert "max_batch_size: 32" in text and "max_batch_size: 0" not in text
    assert "dynamic_batching { max_queue_delay_microseconds: 0 }" in text
    assert text.count("allow_ragged_batch: true") == 2
    untouched = [line for line in SHIPPED.read_text().splitlines() if "max_batch_size" not in line and "name: \"" not in line]
    assert all(line in text for line in untouched)


def test_refuses_a_config_it_does_not_recognise():
    with pytest.raises(ValueError, match="max_batch_size: 0"):
        config_variants.with_triton_batching('name: "embedder"\nmax_batch_size: 8\n')
    with pytest.raises(ValueError, match="input_ids"):
        config_variants.with_triton_batching('max_batch_size: 0\ninput [ { name: "text_input" dims: [ -1 ] } ]\n')
    assert config_variants.main(["bogus"]) == 2


def test_copy_model_sets_parameters_name_and_instances_and_refuses_unknown_keys(tmp_path):
    target = config_variants.copy_model(SHIPPED.parent, tmp_path / "embedder_ep",
                                        {"engine_process": "true", "max_batch_tokens": "4096"}, instances=3)
    text = (target / "config.pbtxt").read_text()
    assert 'name: "embedder_ep"' in text and "instance_group [ { count: 3 " in text
    assert 'key: "engine_process" value: { string_value: "true" }' in text
    assert 'key: "max_batch_tokens" value: { string_value: "4096" }' in text
    assert (target / "1" / "model.py").is_file()
    changed = {line for line in text.splitlines()} - set(SHIPPED.read_text().splitlines())
    assert len(changed) == 4, changed
    with pytest.raises(ValueError, match="max_batch_tokenz"):
        config_variants.with_parameters(text, {"max_batch_tokenz": "1"})
