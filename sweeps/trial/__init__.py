"""Runs in the Ray Tune trial actor: one worker group's rounds, their rows, and what a killed fit left behind."""
