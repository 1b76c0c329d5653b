"""Sweeps: the spec, grid expansion, pre-flight and the Ray Tune/Train orchestration."""

from sweeps.spec import SpecError, SweepSpec
from sweeps.specfile import load_spec, parse_spec

__all__ = ["SpecError", "SweepSpec", "load_spec", "parse_spec"]
