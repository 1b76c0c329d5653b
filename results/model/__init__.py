"""The overlap model and the all-reduce cost model: a step predicted from a profile and a calibration."""
