"""The overlap model before measuring: predicted steps and the workload's profile."""
