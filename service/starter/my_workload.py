"""Your model as a ddpsweep workload (written by `ddpsweep init`): replace the model, the batch and the loss.

The contract: `build(**workload_args)` returns an object with
  model       an nn.Module built on CPU (the harness moves it to the device and wraps it in DDP)
  make_batch  (micro_batch, generator) -> tuple of tensors, built on CPU from `generator` only (each rank's
              generator is seeded from (seed, rank, micro-step): the same data on every run)
  loss        (model, batch) -> a scalar: the MEAN over the batch (DDP averages gradients over ranks, so a
              sum would scale them by the micro-batch; run the forward through `model`, it is the DDP wrapper)
and optionally `tokens_per_sample` (tokens/s is then reported beside samples/s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, width). Returns (B, 10) logits."""
        for layer in self.layers:
            x = x + F.relu(layer(x))  # (B, width)
        return self.head(x)  # (B, 10)


@dataclass
class MyWorkload:
    model: MLP
    width: int

    def make_batch(self, micro_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(micro_batch, self.width, generator=generator)  # (B, width), on CPU
        y = torch.randint(0, 10, (micro_batch,), generator=generator)  # (B,) labels
        return x, y

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)  # mean over the batch


def build(width: int = 256, layers: int = 8) -> MyWorkload:
    return MyWorkload(model=MLP(width, layers), width=width)
