"""The SQL views `ddpsweep query` and `POST /query` see, with what each holds (no imports: the CLI's help
names them without loading the query engine). `results.sql.query` builds them; the docs' SQL reference lists them."""

VIEWS: dict[str, str] = {
    "cells": "Every row, with every column of the results schema, plus its configuration's 95% interval "
    "(step_ms_ci_lo, step_ms_ci_hi, n_repeats, n_steps) and two flags: round_drifted (its round's control moved "
    "beyond its noise: a diagnostic, kept) and noisy (its CV far above its group's).",
    "cell_intervals": "One line per configuration: the pooled median step over its repeats and steps with its "
    "95% interval, n_repeats and n_steps.",
    "cells_vs_baseline": "Every distributed configuration beside its single-worker baseline at the same gas: "
    "efficiency and exposed communication with their intervals (baseline_source says where a gas-1 baseline "
    "scaled by gas stood in).",
    "u_curve": "One line per U-curve (everything but the bucket fixed): the best bucket, the buckets "
    "indistinguishable from it, the largest bucket's step, the overlap saved, min_resolvable_rel and "
    "rounds_for_target; where the cluster has a profile of the workload (`ddpsweep predict`), the overlap "
    "model's predicted best bucket, whether it lies in the indistinguishable set, and the curve's median "
    "|predicted / measured - 1| and Spearman rank correlation, at slowdown 1 and at the slowdown fitted per "
    "placement (`_fitted`).",
    "predicted": "Every measured DDP configuration beside the overlap model's step (from the cluster's stored "
    "profile of its workload and newest calibration): predicted_ms and prediction_error at slowdown 1 and at "
    "the fitted slowdown; prediction_note says why a configuration has no prediction.",
    "no_sync_gain": "Per (placement, gas > 1, bucket): the step with and without no_sync() and what skipping "
    "the all-reduce on gas-1 micro-steps saved, with its interval.",
    "gradient_checks": "Every checked configuration's gradient check: exact, approximate or failed, the median "
    "relative error and its range, the tolerance; failed configurations first (left out of every answer).",
    "stragglers": "One line per device and sweep: its compute (no_sync forward + backward, per rank) against the "
    "other ranks' of the same measurements, as a ratio with its 95% interval, what it costs the others per step "
    "(their wait beyond its own), and `straggler` where the interval lies wholly above 1 + results.analysis.stragglers."
    "MIN_REL; `planted` where DDPSWEEP_SLOWDOWN planted it.",
    "calibration": "All-reduce time by message size on a group's own ranks (and the parameter broadcast), "
    "with algbw and busbw.",
    "alpha_beta": "The α–β fit of the calibration per cluster, sweep, world size, nodes and backend "
    "(latency alpha_us, bandwidth beta_gbps, the worst relative residual), and the overlap model's terms "
    "measured beside it: compute, how many times longer one rank's compute takes beside the group's other ranks; "
    "bucket_ms, the compute-stream cost per DDP bucket; contention, how much longer compute takes while an "
    "all-reduce runs; comm_contention, how much longer an all-reduce takes while compute runs (each with its 95% "
    "interval; null where not measured).",
}
