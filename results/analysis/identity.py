"""What makes two rows the same configuration, derived from the one declaration of the knobs.

The declaration is trainers.knobs (typed dataclass fields, torch-free).

Every view groups, pairs or draws by these lists, never by a list of its own: two rows that differ in any knob
are two configurations, and no analysis, comparison, race, recommendation, scaling series or summary line
pools or pairs them (tests/test_identity.py walks the table to hold this).
"""

from __future__ import annotations

import pandas as pd

from results.knobs import COMPILE, KNOBS, MEASURE, SWEPT, UNSET, WORKLOAD, Knob, show

CONFIGURATION: list[str] = [k.name for k in KNOBS]
"""Every knob: the configuration a row measured (row columns of the same names)."""
CONFIG_KEYS: list[str] = ["cluster", "sweep_id", *CONFIGURATION, "device_type"]
"""One measured configuration of one sweep: its repeats are pooled, nothing else."""
BASELINE_KEYS: list[str] = [
    "cluster",
    "sweep_id",
    *(k.name for k in KNOBS if (k.scope in (WORKLOAD, MEASURE) and k.applies is None) or k.scope == COMPILE),
]
"""What a single-process baseline shares with the DDP cells it is the baseline of (gas is matched apart): a
compiled cell's baseline is compiled the same way."""
CURVE_KEYS: list[str] = [k for k in CONFIG_KEYS if k != SWEPT]
"""One U-curve: everything but the bucket fixed."""
CURVE_KNOBS: list[str] = [k for k in CONFIGURATION if k != SWEPT]
"""One U-curve of one sweep's plan (every cell of a cluster and sweep): every knob but the bucket fixed."""
CHOSEN: list[Knob] = [k for k in KNOBS if k.chosen]
"""The settings a user picks in a training script, with PyTorch's defaults (recommend chooses among them)."""
PYTORCH_DEFAULTS: dict[str, object] = {k.name: k.pytorch for k in CHOSEN}


def with_knobs(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with every knob column (a frame built without one gets what older rows had, else its default)."""
    missing = {k.name: k.older_rows if k.older_rows is not UNSET else k.default for k in KNOBS if k.name not in rows}
    if "device_type" not in rows:
        missing["device_type"] = None
    return rows.assign(**missing) if missing else rows


def config_text(frame: pd.DataFrame, keys: list[str] | None = None) -> list[str]:
    """Each line's configuration (`keys`, default CONFIG_KEYS) as text, to match lines of two frames: a column of
    nulls has no one dtype (rows read it as strings, ok_cells as floats), so a merge on the columns can fail."""
    return ["|".join(show(v) for v in values) for values in frame[keys or CONFIG_KEYS].itertuples(index=False)]


def varying(frame: pd.DataFrame, keys: list[str] | None = None) -> list[str]:
    """The knobs (of `keys`, default every one) whose value differs across `frame`: what tells its lines apart."""
    keys = CONFIGURATION if keys is None else keys
    return [k for k in keys if k in frame and frame[k].astype(str).nunique(dropna=False) > 1]


def labels(values: dict, keys: list[str]) -> str:
    """`k=v k=v` for `keys` (values as text shows them)."""
    return " ".join(f"{k}={show(values[k])}" for k in keys)


def with_varying(columns: list[str], frame: pd.DataFrame) -> list[str]:
    """`columns` for a table of `frame`, with every knob that varies in it added after the leading configuration
    columns: two lines that differ in a knob never look alike."""
    lead = {"cluster", "sweep_id", "topology", *CONFIG_KEYS}
    at = next((i for i, c in enumerate(columns) if c not in lead), len(columns))
    extra = [k for k in varying(frame) if k not in columns]
    return [*columns[:at], *extra, *columns[at:]]


def keys_but(*names: str) -> list[str]:
    """CONFIG_KEYS less `names`: one line of a figure whose x axis (or best-of) runs over `names`."""
    return [k for k in CONFIG_KEYS if k not in names]


def line_label(values: dict, frame: pd.DataFrame, shown: list[str]) -> str:
    """`shown` as `k=v`, then every other knob that varies in `frame`: two lines never share a label."""
    extra = [k for k in varying(frame) if k not in shown and k in values]
    return labels(values, [*shown, *extra])
