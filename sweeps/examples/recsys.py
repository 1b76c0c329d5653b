"""A recommender-shaped workload: embedding tables, then many small layers.

Not GPT-shaped on purpose: nearly all gradient bytes sit in the tables (registered first, so their gradients
are ready last in backward and fill the last buckets), and the rest is many small tensors that small buckets
send one by one. With `tables: 1` one table serves every field; with `tables: T` the rows are sharded into T
tables (field f looks up table f mod T), as recommenders keep a table per feature: T tensors instead of one.
Written with torch only, against the workload contract (trainers/workload.py).

    workload: "sweeps.examples.recsys:build"
    workload_args: {rows: 200000, dim: 32, fields: 8, layers: 16, width: 64, tables: 1}
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class EmbeddingMLP(nn.Module):
    def __init__(self, rows: int, dim: int, fields: int, layers: int, width: int, tables: int = 1) -> None:
        super().__init__()
        # (rows / tables, dim) each: most of the gradient bytes
        self.tables = nn.ModuleList(nn.Embedding(rows // tables, dim) for _ in range(tables))
        self.inp = nn.Linear(fields * dim, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))  # many small tensors
        self.out = nn.Linear(width, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (B, fields) row indices. Returns (B,) logits."""
        T = len(self.tables)
        x = torch.cat([self.tables[f % T](ids[:, f]) for f in range(ids.shape[1])], dim=1)  # (B, fields * dim)
        x = F.relu(self.inp(x))  # (B, width)
        for layer in self.hidden:
            x = x + F.relu(layer(x))  # (B, width), residual
        return self.out(x).squeeze(-1)  # (B,)


@dataclass
class RecsysWorkload:
    model: EmbeddingMLP
    rows: int  # per table
    fields: int

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, self.rows, (micro_batch, self.fields), generator=generator)  # (B, fields)
        clicks = torch.randint(0, 2, (micro_batch,), generator=generator).float()  # (B,) labels
        return ids, clicks

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        ids, clicks = batch
        return F.binary_cross_entropy_with_logits(model(ids), clicks)  # mean over the batch


def build(
    rows: int = 200_000, dim: int = 32, fields: int = 8, layers: int = 16, width: int = 64, tables: int = 1
) -> RecsysWorkload:
    """The workload factory: `rows` x `dim` of embeddings (fp32: rows * dim * 4 bytes of gradient) in `tables`
    tables of rows / tables each, `layers` small width x width layers."""
    if not 1 <= tables <= fields or rows % tables:
        raise ValueError(f"tables: {tables} must be 1 to fields ({fields}) and divide rows ({rows})")
    model = EmbeddingMLP(rows, dim, fields, layers, width, tables)
    return RecsysWorkload(model=model, rows=rows // tables, fields=fields)
