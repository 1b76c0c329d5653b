"""Runs in the driver (and the service's dry run): the grid, the plan of (cell, repeat) pairs, pre-flight."""
