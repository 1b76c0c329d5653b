"""A workload whose model has a layer no forward uses (a skipped branch): DDP needs find_unused_parameters."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class SkipsABranch(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.used = nn.Linear(width, 1)
        self.unused = nn.Linear(width, width)  # never called: its parameters get no gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, width). Returns (B,)."""
        return self.used(x).squeeze(-1)


@dataclass
class Unused:
    model: SkipsABranch
    width: int

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(micro_batch, self.width, generator=generator)  # (B, width)
        return x, torch.randn(micro_batch, generator=generator)  # (B,) targets

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(model(x), y)


def build(width: int = 8) -> Unused:
    return Unused(model=SkipsABranch(width), width=width)
