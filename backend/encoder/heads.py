"""What one response holds, from the head rows the engine computed for a request's sequences
(pure numpy: the same code answers served requests and is checked in tests without Triton).

A classification head's logits become probabilities by one rule for every family: a sigmoid
per label for one-logit heads (a reranker's relevance) and multi-label heads (`problem_type:
multi_label_classification`), a softmax over the labels otherwise, as Hugging Face's
pipelines apply them.
"""
from __future__ import annotations

import numpy as np

from tritonformer.backend.models.encoder import ClassifierLabels


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def relevance_outputs(raw: bool):
    """A reranker request's response: logits `[n, 1]` -> `scores` `[n]`, the sigmoid of each
    logit, or with `raw` the logit itself."""
    def outputs(rows: np.ndarray) -> dict:
        logits = rows[:, 0].astype(np.float32)
        return {"scores": logits if raw else sigmoid(logits)}
    return outputs


def probabilities(logits: np.ndarray, labels: ClassifierLabels) -> np.ndarray:
    if labels.multi_label or labels.num_labels == 1:
        return sigmoid(logits)
    return softmax(logits)


def label_outputs(labels: ClassifierLabels):
    """A classifier request's response: logits `[n, labels]` -> `probabilities` `[n, labels]`
    and `labels` `[n]`, the name of each text's most likely label (id2label)."""
    names = np.array([name.encode() for name in labels.names], dtype=object)

    def outputs(rows: np.ndarray) -> dict:
        return {"probabilities": probabilities(rows, labels), "labels": names[np.argmax(rows, axis=1)]}
    return outputs
