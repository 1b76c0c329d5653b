"""Runs on every Ray Train worker (the only sweeps package that imports torch): the measured cells on their ranks."""
