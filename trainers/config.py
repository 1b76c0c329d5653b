"""Configuration of one measured cell (its result: trainers.knobs.Measurement)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from trainers.errors import ConfigError
from trainers.knobs import BY_NAME, COMM_HOOKS, MODES, STEP_KNOBS, TIMINGS, StepKnobs, check
from trainers.presets import PRESETS

__all__ = ["COMM_HOOKS", "MODES", "TIMINGS", "StepConfig", "canonical_args"]

WORKLOAD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class StepConfig(StepKnobs):
    """One cell's training step, as every rank runs it: one field per knob of `trainers.knobs.StepKnobs`.

    Each field is checked against its knob; a knob that does not apply to the cell (`Knob.applies`, e.g. the
    bucket outside ddp mode) reads its `off` value, so one cell has one spelling."""

    def __post_init__(self) -> None:
        if self.workload is not None:
            self._check_workload()
        elif self.model not in PRESETS:
            raise ConfigError("model", self.model, f"one of {', '.join(PRESETS)}")
        for knob in STEP_KNOBS:
            value = getattr(self, knob.name)
            if knob.name in ("model", "workload") or (value is None and knob.value_off is None):
                continue  # checked above; null where a knob reads null when it does not apply (a None bucket)
            allowed = check(knob, value)
            if allowed is not None:
                raise ConfigError(knob.name, value, allowed)
        block = PRESETS[self.model].block_size if self.workload is None else self.seq_len
        if self.seq_len > block:
            raise ConfigError("seq_len", self.seq_len, f"1..{block} (block size of {self.model})")
        t = self.target_rel_ci
        if t is not None and not 0 < t < 1:
            raise ConfigError("target_rel_ci", t, "a fraction in (0, 1), e.g. 0.02 for ±2%")
        if self.comm_hook == "powersgd" and self.mode == "ddp" and self.powersgd_start_iter > self.warmup_steps:
            raise ConfigError(
                "powersgd_start_iter",
                self.powersgd_start_iter,
                f"at most warmup_steps ({self.warmup_steps}) so the timed steps are compressed (raise warmup_steps)",
            )
        self._check_timing()
        self._normalize()
        if self.mode == "ddp" and self.bucket_cap_mb is None:
            raise ConfigError("bucket_cap_mb", self.bucket_cap_mb, "a number of MB in [0.001, 100000]")

    def _check_workload(self) -> None:
        if not isinstance(self.workload, str) or not WORKLOAD_PATH.fullmatch(self.workload):
            raise ConfigError("workload", self.workload, "an import path `package.module:factory`")
        if self.workload.partition(":")[2].startswith("_"):
            raise ConfigError("workload", self.workload, "a public factory: a name that does not start with '_'")
        try:
            args = json.loads(self.workload_args)
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            raise ConfigError("workload_args", self.workload_args, "a JSON object of keyword arguments")
        object.__setattr__(self, "workload_args", canonical_args(args))
        object.__setattr__(self, "model", self.workload)  # rows, groups and reports name the workload
        object.__setattr__(self, "seq_len", 1)  # a preset's knob: one spelling for every workload cell

    def _check_timing(self) -> None:
        if self.timing == "loop" and self.target_rel_ci is not None:
            raise ConfigError("timing", self.timing, "sync or events with target_rel_ci (it needs per-step times)")

    def _normalize(self) -> None:
        """Knobs that do not apply to the cell read their `off` value (in table order: a knob's rule may read
        one normalized before it). gradient_as_bucket_view left None in ddp mode takes its default."""
        if self.mode == "ddp" and self.gradient_as_bucket_view is None:
            object.__setattr__(self, "gradient_as_bucket_view", BY_NAME["gradient_as_bucket_view"].default)
        for knob in STEP_KNOBS:
            if knob.applies is not None and not knob.applies(self):
                object.__setattr__(self, knob.name, knob.value_off)

    @property
    def grad_compression(self) -> str:
        """What the hook does to the gradients: none | fp16 | bf16 | powersgd-rank-N."""
        return f"powersgd-rank-{self.powersgd_rank}" if self.comm_hook == "powersgd" else self.comm_hook

    @property
    def tokens_per_rank(self) -> int | None:
        """Tokens one rank processes per optimizer step (None for a user workload: known where it runs)."""
        return None if self.workload is not None else self.micro_batch * self.seq_len * self.gas

    @property
    def samples_per_rank(self) -> int:
        """Samples (sequences for GPT) one rank processes per optimizer step."""
        return self.micro_batch * self.gas


def canonical_args(args: dict) -> str:
    """Workload arguments as canonical JSON: the same arguments always give the same text (and cell id)."""
    try:
        return json.dumps(args, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError("workload_args", args, f"JSON values only ({e})") from None
