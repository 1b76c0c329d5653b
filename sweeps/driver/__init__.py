"""Runs in the sweep's driver process: Ray Tune launched, the session and its signals, this machine, the summary."""
