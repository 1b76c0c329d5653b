"""Model shapes and the named presets. No torch here: specs and configs validate against it cheaply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of a GPT model."""

    n_layer: int
    """Number of transformer blocks."""
    n_head: int
    """Attention heads per block; must divide `n_embd`."""
    n_embd: int
    """Residual stream width C."""
    block_size: int
    """Longest sequence the position embedding covers (tokens)."""
    vocab_size: int = 50304
    """Token vocabulary; GPT-2's 50257 padded up to a multiple of 64."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


PRESETS: dict[str, GPTConfig] = {
    # CPU presets: a step takes tens of milliseconds on one core.
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128, vocab_size=4096),
    "small": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=8192),
    # GPT-2 family (vocab 50304): the seed's model is gpt2-124m.
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "gpt2-350m": GPTConfig(n_layer=24, n_head=16, n_embd=1024, block_size=1024),
    "gpt2-774m": GPTConfig(n_layer=36, n_head=20, n_embd=1280, block_size=1024),
    "gpt2-1558m": GPTConfig(n_layer=48, n_head=25, n_embd=1600, block_size=1024),
}
