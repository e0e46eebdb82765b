"""The classification heads of cross-encoders, which mlx-embeddings' encoder
classes do not carry (their names and shapes are transformers', so a
checkpoint's ``classifier.*`` weights load as they are)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


class BertHead(nn.Module):
    """``BertForSequenceClassification``: the pooler's output -> linear."""

    def __init__(self, hidden: int, labels: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(hidden, labels)

    def __call__(self, out: Any) -> mx.array:
        return self.classifier(out.pooler_output)


class RobertaHead(nn.Module):
    """``XLMRobertaClassificationHead``: the first token -> dense -> tanh -> out_proj."""

    def __init__(self, hidden: int, labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, labels)

    def __call__(self, out: Any) -> mx.array:
        return self.out_proj(mx.tanh(self.dense(out.last_hidden_state[:, 0])))
