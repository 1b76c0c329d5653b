"""Example workloads: models that are not GPT-shaped, written against the workload contract alone."""
