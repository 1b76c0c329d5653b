"""Tier 1: model presets, config validation, statistics, and the bench CLI's bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainers.config import StepConfig
from trainers.errors import ConfigError
from trainers.model import GPT, PRESETS, grad_bytes, n_params
from trainers.stats import summarize


def test_gpt2_124m_has_124m_parameters_and_498mb_of_gradients():
    model = GPT(PRESETS["gpt2-124m"])
    assert n_params(model) == pytest.approx(124e6, rel=0.01)
    assert grad_bytes(model) == 4 * n_params(model)
    assert grad_bytes(model) == pytest.approx(498e6, rel=0.01)
    assert model.lm_head.weight is model.wte.weight


def test_gpt2_presets_grow_and_pad_the_vocab():
    assert PRESETS["gpt2-350m"].n_layer == 24 and PRESETS["gpt2-124m"].vocab_size == 50304
    assert PRESETS["gpt2-350m"].vocab_size % 64 == 0


@pytest.mark.parametrize(
    ("kwargs", "field", "allowed"),
    [
        ({"bucket_cap_mb": 0}, "bucket_cap_mb", "in [0.001, 100000]"),
        ({"bucket_cap_mb": -5.0}, "bucket_cap_mb", "in [0.001, 100000]"),
        ({"gas": 0}, "gas", "an integer in [1, 4096]"),
        ({"model": "gpt5"}, "model", "gpt2-124m"),
        ({"micro_batch": 0}, "micro_batch", "an integer in [1, 65536]"),
        ({"seq_len": 129}, "seq_len", "1..128"),
        ({"mode": "fsdp"}, "mode", "single, ddp, naive"),
        ({"warmup_steps": -1}, "warmup_steps", "an integer in [0, 100000]"),
    ],
)
def test_bad_config_names_the_field_and_the_allowed_values(kwargs, field, allowed):
    with pytest.raises(ConfigError) as err:
        StepConfig(**kwargs)
    assert err.value.field == field
    assert allowed in str(err.value) and field in str(err.value)


def test_summary_statistics_on_known_values():
    s = summarize([10.0, 20.0, 30.0, 40.0, 50.0])
    assert s["step_ms"] == 30.0 and s["step_ms_mean"] == 30.0
    assert s["step_ms_p10"] == pytest.approx(14.0) and s["step_ms_p90"] == pytest.approx(46.0)
    assert s["step_ms_cv"] == pytest.approx((200.0**0.5) / 30.0)


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainers.bench", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--bucket-cap-mb", "0"], "bucket_cap_mb"),
        (["--gas", "0"], "gas"),
        (["--model", "nope"], "model"),
        (["--micro-batch", "0"], "micro_batch"),
        (["--seq-len", "4096"], "seq_len"),
        (["--mode", "zero3"], "mode"),
        (["--threads", "0"], "threads"),
    ],
)
def test_bench_cli_exits_2_naming_the_field(args, field):
    proc = bench(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {field}:") and "allowed" in proc.stderr
    assert proc.stdout == ""


def test_bench_single_mode_prints_one_json_row():
    proc = bench("--mode", "single", "--warmup", "1", "--steps", "3", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.strip().splitlines()
    row = json.loads(line)
    assert row["mode"] == "single" and row["world_size"] == 1 and row["num_threads"] == 1
    assert len(row["step_times_ms"]) == 3 and row["step_ms"] > 0


def test_median_interval_is_order_statistics_and_narrows_with_more_steps():
    from trainers.stats import median_ci, median_rel_half_width

    values = [float(v) for v in range(1, 101)]  # median 50.5; 95%: ranks 50 -/+ 9.8 -> 40 .. 61
    assert median_ci(values) == (40.0, 61.0)
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for order statistics: the range
    assert median_rel_half_width([100.0] * 30) == 0.0
    few, many = ([100.0 + (i % 7) for i in range(n)] for n in (14, 140))
    assert median_rel_half_width(many) < median_rel_half_width(few)
