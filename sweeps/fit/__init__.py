"""Runs in the fit task: one TorchTrainer for one group, with the torch backend that needs no torch there."""
