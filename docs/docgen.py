"""The reference pages of the docs site, generated from the code's own declarations (never written by hand):
the spec from `SweepSpec` and the knob table, the row schema from `results/storage/schema.py`, the SQL views from
`results.sql.query.VIEWS`, the CLI from the Typer app, the HTTP API from the OpenAPI document, the errors from the
error tree.

    python docs/docgen.py docs/reference     # what `make docs` runs before `mkdocs build --strict`
"""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a class's fields (`name: type = default` then a string literal)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for node, after in zip(body, body[1:], strict=False):
        field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if field and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            out[node.target.id] = inspect.cleandoc(str(after.value.value))
    return out


CODE_SPAN = re.compile(r"(`[^`]*`)")


def _text(text: Any) -> str:
    """Documentation text for a Markdown page: HTML in it is shown, never rendered (`<script>` is text), except
    inside code spans, which Markdown already shows as written."""
    parts = CODE_SPAN.split(str(text))
    return "".join(p if i % 2 else html.escape(p, quote=False) for i, p in enumerate(parts))


def _cell(text: Any) -> str:
    """A value for a Markdown table cell: one line, pipes escaped, HTML shown as text."""
    return _text(" ".join(str(text).split())).replace("|", "\\|")


def _default(f: dataclasses.Field) -> str:
    """A field's default as YAML writes it (`[false]`, `null`), or `required`."""
    import yaml

    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def spec_docs() -> dict[str, tuple[str, str, str]]:
    """Every spec key: (kind, default, documentation)."""
    from sweeps.spec.sweep import SweepSpec

    own = attribute_docs(SweepSpec)
    out = {}
    fields = sorted(dataclasses.fields(SweepSpec), key=lambda f: f.name not in own)  # the spec's own keys first
    for f in fields:
        knob = f.metadata.get("knob")
        if knob is not None and f.name not in own:
            kind = f"list of {knob.kind}" if knob.spec == "axis" else knob.kind
            if knob.choices:
                kind += f" ({' / '.join(knob.choices)})"
            out[f.name] = (kind, _default(f), knob.doc)
        else:
            kind = str(f.type).replace("typing.", "")
            out[f.name] = (kind, _default(f), own.get(f.name, ""))
    return out


def spec_reference() -> str:
    rows = [f"| `{k}` | {_cell(kind)} | {_cell(d)} | {_cell(doc)} |" for k, (kind, d, doc) in spec_docs().items()]
    return "\n".join(
        [
            "# Spec reference",
            "",
            "Every key a sweep spec (YAML) may hold; an unknown key is refused with the list of these. Keys whose",
            "kind is a list are grid axes: every combination is a cell. Generated from `sweeps.spec.sweep.SweepSpec`",
            "and the knob table (`trainers.knobs`).",
            "",
            "| key | kind | default | what it does |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )


FIELD_LINE = re.compile(r'pa\.field\("(\w+)",[^#]*?(?:#\s*(.*))?$')
KNOB_LINE = re.compile(r'_knob_column\(BY_NAME\["(\w+)"\]\),?\s*(?:#\s*(.*))?$')
MEASURED_LINE = re.compile(r"^    (\w+): [^#]+#\s*(.*)$")  # a field of trainers.knobs.Measurement


def column_docs() -> dict[str, str]:
    """Every row column's documentation: the comment beside it in results/storage/schema.py or, for a measurement, in
    trainers.knobs.Measurement, else its knob's doc."""
    from results.storage.schema import SCHEMA
    from sweeps.spec.sweep import knob_docs
    from trainers.knobs import Measurement

    comments: dict[str, str] = {}
    for line in (ROOT / "results" / "storage" / "schema.py").read_text().splitlines():
        m = FIELD_LINE.search(line) or KNOB_LINE.search(line)
        if m and m.group(2):
            comments.setdefault(m.group(1), m.group(2).strip())
    for line in inspect.getsource(Measurement).splitlines():
        m = MEASURED_LINE.match(line)
        if m:
            comments.setdefault(m.group(1), m.group(2).strip())
    knobs = knob_docs()
    return {f.name: comments.get(f.name) or knobs.get(f.name, "") for f in SCHEMA}


def schema_reference() -> str:
    from results.storage.schema import OLDER_ROWS, SCHEMA

    docs = column_docs()
    rows = [
        f"| `{f.name}` | `{f.type}` | {_cell(docs[f.name])}"
        + (f" (older rows: `{OLDER_ROWS[f.name]}`)" if f.name in OLDER_ROWS else "")
        + " |"
        for f in SCHEMA
    ]
    return "\n".join(
        [
            "# Results schema",
            "",
            "One Parquet row per measurement, every file written with this schema (`results/storage/schema.py`); a",
            "column added later reads, on older rows, the value those rows had. Times in ms, memory in bytes.",
            "",
            "| column | type | meaning |",
            "| --- | --- | --- |",
            *rows,
            "",
        ]
    )


def sql_reference() -> str:
    from results.sql.formats import FORMATS
    from results.sql.views import VIEWS

    rows = [f"| `{name}` | {_cell(doc)} |" for name, doc in VIEWS.items()]
    return "\n".join(
        [
            "# SQL views",
            "",
            '`ddpsweep query "SELECT …"` and `POST /query` run one read-only SELECT (DuckDB) over these views,',
            f"in a sandbox (no file access, a time and size limit). Output formats: {', '.join(FORMATS)}.",
            "",
            "| view | what it holds |",
            "| --- | --- |",
            *rows,
            "",
            "`cells` has every column of the [results schema](schema.md).",
            "",
        ]
    )


def _param_row(p) -> str:
    names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
    # typer's own rendering (<table|csv|json>, <str>, <float range>); a metavar where the option names one
    shown = p.metavar or p.display_type(None).strip("<>").replace("|", " | ")
    kind = "flag" if getattr(p, "is_flag", False) else shown
    default = "" if p.default in (None, False, ()) or p.required else f"`{p.default}`"
    what = "required" if p.required else default
    return f"| {names} | {_cell(kind)} | {what} | {_cell(getattr(p, 'help', '') or '')} |"


def cli_commands() -> dict[str, Any]:
    """The CLI's commands by name (click objects of the Typer app)."""
    import typer.main

    from service.cli import app

    return dict(sorted(typer.main.get_command(app).commands.items()))  # type: ignore[attr-defined]


def options(cmd) -> list:
    """A command's visible options (typer vendors its own click: classes are told apart by their kind)."""
    return [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]


def cli_reference() -> str:
    lines = [
        "# CLI reference",
        "",
        "`ddpsweep COMMAND --help` prints the same. Exit codes: see [errors](errors.md).",
        "",
    ]
    for name, cmd in cli_commands().items():
        lines += [f"## `ddpsweep {name}`", "", _text(inspect.cleandoc(cmd.help or "")), ""]
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        opts = options(cmd)
        for a in args:
            lines.append(f"Argument `{a.name.upper()}`: {_cell(getattr(a, 'help', '') or '')}")
        if args:
            lines.append("")
        if opts:
            lines += ["| option | value | default | what it does |", "| --- | --- | --- | --- |"]
            lines += [_param_row(p) for p in opts]
            lines.append("")
    return "\n".join(lines)


def http_reference() -> str:
    from service.api import ServiceSettings, create_app

    spec = create_app(ServiceSettings(address=None, results=str(ROOT), token=None)).openapi()
    lines = [
        "# HTTP API",
        "",
        "`ddpsweep serve` answers these (generated from its OpenAPI document, also served at `/openapi.json`).",
        'Every error has one shape: `{"error": {"type": …, "message": …, "field": …}}`.',
        "",
    ]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            lines += [f"## `{method.upper()} {path}`", "", _cell(op.get("description") or op.get("summary", "")), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | required | what it is |", "| --- | --- | --- | --- |"]
                for p in params:
                    doc = p.get("description") or p.get("schema", {}).get("description", "")
                    lines.append(f"| `{p['name']}` | {p['in']} | {p.get('required', False)} | {_cell(doc)} |")
                lines.append("")
            codes = ", ".join(sorted(op.get("responses", {})))
            lines += [f"Responses: {codes}.", ""]
    return "\n".join(lines)


def errors_reference() -> str:
    import trainers.errors as root_errors  # the measuring core's tree (service may name its error types)
    from results import errors as results_errors

    return "\n".join(
        [
            "# Errors and exit codes",
            "",
            "Every error ddpsweep raises on purpose names the field and what is allowed. The CLI prints it as one",
            "line `error: …` and exits with a code; the HTTP API answers with the class's status and one JSON",
            "shape.",
            "",
            "| exit code | meaning |",
            "| --- | --- |",
            "| 0 | done |",
            "| 1 | it ran and gave nothing: `run` whose every measurement failed (the error rows are stored), "
            "`calibrate` with a worker group that wrote no calibration; the message says why |",
            "| 2 | bad input or a refused request: the message names the field and the fix (no data written is lost) |",
            "| 130 | interrupted (Ctrl-C): rows already written stay; the message gives the command that resumes |",
            "| 143 | terminated (SIGTERM: kill, Kubernetes, Ray Jobs' stop): as 130 |",
            "",
            "## The error trees",
            "",
            "One root, `DDPSweepError`; `ResultsError` (the store and its queries) derives from it. The CLI and the",
            "HTTP API each have one handler for the tree: each class carries the HTTP status the API answers with.",
            "",
            "```",
            inspect.cleandoc(root_errors.__doc__ or "").split("\n\n")[-1],
            "",
            inspect.cleandoc(results_errors.__doc__ or "").split("\n\n", 1)[1].split("\n\n")[0],
            "```",
            "",
        ]
    )


PAGES = {
    "spec.md": spec_reference,
    "schema.md": schema_reference,
    "sql.md": sql_reference,
    "cli.md": cli_reference,
    "http.md": http_reference,
    "errors.md": errors_reference,
}


def write_all(folder: Path) -> list[Path]:
    """Write every reference page into `folder`; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, page in PAGES.items():
        path = folder / name
        path.write_text(page())
        out.append(path)
    bench = ROOT / "benchmarks" / "README.md"
    (folder.parent / "benchmarks.md").write_text(bench.read_text())  # the measurements, one page of the site
    return out


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "reference")):
        print(p)
