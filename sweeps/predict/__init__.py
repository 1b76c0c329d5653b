"""The overlap model before measuring: predicted steps, the workload's profile, `search: model`."""
