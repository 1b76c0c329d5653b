"""Sweeps: the spec, grid expansion, pre-flight and the Ray Tune/Train orchestration."""

from sweeps.spec.files import load_spec, parse_spec
from sweeps.spec.sweep import SpecError, SweepSpec

__all__ = ["SpecError", "SweepSpec", "load_spec", "parse_spec"]
