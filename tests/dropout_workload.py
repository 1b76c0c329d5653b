"""A workload with dropout: every backward of one batch differs (a new mask per forward), as a training run's does."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DropoutMLP:
    model: nn.Module
    width: int

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(micro_batch, self.width, generator=generator)  # (B, width)
        return x, torch.randn(micro_batch, 1, generator=generator)  # (B, 1) targets

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(model(x), y)


def build(width: int = 64, p: float = 0.1) -> DropoutMLP:
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(p), nn.Linear(width, 1))
    return DropoutMLP(model=model, width=width)
