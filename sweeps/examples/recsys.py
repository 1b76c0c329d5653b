"""A recommender-shaped workload: one large embedding table, then many small layers.

Not GPT-shaped on purpose: nearly all gradient bytes sit in one tensor (the table, registered first, so its
gradient is ready last in backward and fills the last bucket), and the rest is many small tensors that
small buckets would send one by one. Written with torch only, against the workload contract (trainers/workload.py).

    workload: "sweeps.examples.recsys:build"
    workload_args: {rows: 200000, dim: 32, fields: 8, layers: 16, width: 64}
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class EmbeddingMLP(nn.Module):
    def __init__(self, rows: int, dim: int, fields: int, layers: int, width: int) -> None:
        super().__init__()
        self.table = nn.Embedding(rows, dim)  # (rows, dim): most of the gradient bytes
        self.inp = nn.Linear(fields * dim, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))  # many small tensors
        self.out = nn.Linear(width, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (B, fields) row indices. Returns (B,) logits."""
        B = ids.shape[0]
        x = self.table(ids).view(B, -1)  # (B, fields * dim)
        x = F.relu(self.inp(x))  # (B, width)
        for layer in self.hidden:
            x = x + F.relu(layer(x))  # (B, width), residual
        return self.out(x).squeeze(-1)  # (B,)


@dataclass
class RecsysWorkload:
    model: EmbeddingMLP
    rows: int
    fields: int

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, self.rows, (micro_batch, self.fields), generator=generator)  # (B, fields)
        clicks = torch.randint(0, 2, (micro_batch,), generator=generator).float()  # (B,) labels
        return ids, clicks

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        ids, clicks = batch
        return F.binary_cross_entropy_with_logits(model(ids), clicks)  # mean over the batch


def build(rows: int = 200_000, dim: int = 32, fields: int = 8, layers: int = 16, width: int = 64) -> RecsysWorkload:
    """The workload factory: `rows` x `dim` table (fp32: rows * dim * 4 bytes of gradient), `layers` small
    width x width layers."""
    return RecsysWorkload(model=EmbeddingMLP(rows, dim, fields, layers, width), rows=rows, fields=fields)
