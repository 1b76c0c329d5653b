"""What a spec may run: the variables it sets and the workload code it names, checked before it runs."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service.api import ServiceSettings, create_app
from service.cli import app
from service.workdir import check_workdir
from sweeps.spec.files import parse_spec
from sweeps.spec.sweep import SpecError
from trainers.errors import ConfigError


def client(**settings) -> TestClient:
    defaults = {"address": "http://127.0.0.1:9", "results": "/nonexistent/r", "token": "t"}
    return TestClient(create_app(ServiceSettings(**(defaults | settings))))


def post(c: TestClient, text: str):
    return c.post("/sweeps", content=text, headers={"Authorization": "Bearer t"})


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('env: {GLOO_LEAK: "${SECRET_CLUSTER_TOKEN}"}', "env.GLOO_LEAK"),
        ("env: {NCCL_DEBUG: $HOME}", "env.NCCL_DEBUG"),
        ('env_grid: {NCCL_ALGO: [Ring, "Tree\\u001b]52;c;AAAA\\u0007"]}', "env_grid.NCCL_ALGO[1]"),
        ('env: {NCCL_ALGO: "Ring\\nTree"}', "env.NCCL_ALGO"),
    ],
)
def test_env_values_are_literal_printable_text(line, field):
    with pytest.raises(SpecError) as e:
        parse_spec(f"name: x\n{line}\n")
    assert e.value.field == field and "$" in e.value.allowed and "printable" in e.value.allowed


def test_a_secret_in_an_env_value_is_refused_over_http_before_submission():
    r = post(client(), 'name: x\nenv: {GLOO_LEAK: "${SECRET_CLUSTER_TOKEN}"}\n')
    assert r.status_code == 422 and r.json()["error"]["field"] == "env.GLOO_LEAK"


def test_the_row_records_the_value_the_spec_gave(monkeypatch):
    from sweeps.worker import fingerprint

    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "what-ray-expanded")
    monkeypatch.setenv("NCCL_IB_HCA", "the-clusters-own")
    env = json.loads(fingerprint.collect(torch.device("cpu"), {"NCCL_SOCKET_IFNAME": "eth0"})["env"])
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_HCA"] == "the-clusters-own"


EVIL = """
from json import loads as load_state_dict_from_url  # an import, not a workload


def build():
    raise AssertionError("never called by these tests")


class Workload:
    pass
"""


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    (tmp_path / "acme_models").mkdir()
    (tmp_path / "acme_models" / "__init__.py").write_text("")
    (tmp_path / "acme_models" / "gpt.py").write_text(EVIL)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "acme_models.gpt"
    sys.modules.pop("acme_models.gpt", None)
    sys.modules.pop("acme_models", None)


@pytest.mark.parametrize(
    ("attr", "why"),
    [("load_state_dict_from_url", "defined in acme_models.gpt"), ("__builtins__", "public"), ("_x", "public")],
)
def test_a_factory_the_module_only_imported_or_hides_is_refused(evil_module, attr, why):
    from trainers.workload import load_factory

    with pytest.raises(ConfigError) as e:
        load_factory(f"{evil_module}:{attr}")
    assert e.value.field == "workload" and why in e.value.allowed


def test_a_factory_defined_in_the_module_loads_without_being_called(evil_module):
    from trainers.workload import load_factory

    assert load_factory(f"{evil_module}:build").__name__ == "build"
    assert load_factory(f"{evil_module}:Workload").__name__ == "Workload"


def test_a_private_factory_is_refused_at_validation():
    with pytest.raises(SpecError) as e:
        parse_spec('name: x\nworkload: "acme.models:__class__"\n')
    assert e.value.field == "workload" and "public" in e.value.allowed


@pytest.mark.parametrize("name", ["NCCL_NET_PLUGIN", "NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "GLOO_X"])
def test_a_variable_beyond_tuning_is_a_403_naming_it(name):
    r = post(client(), f"name: x\nenv: {{{name}: /tmp/x}}\n")
    assert r.status_code == 403 and r.json()["error"]["field"] == f"env.{name}"
    assert f"--allow-env {name}" in r.json()["error"]["message"]
    grid = post(client(), f"name: x\nenv_grid: {{{name}: [/tmp/x, /tmp/y]}}\n")
    assert grid.status_code == 403 and grid.json()["error"]["field"] == f"env_grid.{name}"


def test_allow_env_and_tuning_variables_pass_the_check():
    allowed = post(client(allow_env=("NCCL_TOPO_FILE",)), "name: x\nenv: {NCCL_TOPO_FILE: /etc/topo.xml}\n")
    tuning = post(client(), "name: x\nenv: {NCCL_ALGO: Ring}\nenv_grid: {NCCL_PROTO: [Simple, LL]}\n")
    assert allowed.status_code != 403 and tuning.status_code != 403  # on to the (unreachable) cluster


def test_the_cli_warns_for_a_variable_that_loads_code(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\nworkers: [2]\nenv: {NCCL_NET_PLUGIN: /tmp/evil.so}\n")
    out = CliRunner().invoke(app, ["run", str(spec), "--dry-run", "--results", str(tmp_path / "r")])
    assert "warning: env.NCCL_NET_PLUGIN" in out.output and "dlopen" in out.output


def test_a_server_without_a_workload_dir_ships_nothing_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the server's cwd, with a secret in it
    (tmp_path / "secret.txt").write_text("s3cr3t")
    c = client(allow_workload=("acme",))
    r = post(c, 'name: x\nworkload: "acme.models:build"\n')
    assert r.status_code == 422 and r.json()["error"]["field"] == "workload"
    assert "--workload-dir" in r.json()["error"]["message"]


def test_workdirs_that_leave_loop_or_are_missing_are_refused_before_packaging(tmp_path):
    ok = tmp_path / "ok"
    (ok / "pkg").mkdir(parents=True)
    (ok / "pkg" / "m.py").write_text("x = 1\n")
    os.symlink(ok / "pkg" / "m.py", ok / "inside_link.py")
    assert check_workdir(ok) == ok.resolve()
    leaks = tmp_path / "leaks"
    leaks.mkdir()
    os.symlink("/etc", leaks / "ssh_link")
    loops = tmp_path / "loops"
    (loops / "a").mkdir(parents=True)
    os.symlink(loops, loops / "a" / "up")
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(b"0" * 4096)
    cases = [(leaks, "links stay inside"), (loops, "without loops"), (tmp_path / "nope", "an existing folder")]
    cases += [("/", "not the filesystem root")]
    for path, why in cases:
        with pytest.raises(ConfigError) as e:
            check_workdir(path)
        assert why in e.value.allowed, (path, e.value)
    with pytest.raises(ConfigError, match="at most"):
        check_workdir(big, max_bytes=1024)


def test_serve_refuses_a_workload_dir_that_leaks(tmp_path):
    os.symlink("/etc", tmp_path / "etc_link")
    out = CliRunner().invoke(app, ["serve", "--workload-dir", str(tmp_path), "--port", "9"])
    assert out.exit_code == 2 and "--workload-dir" in out.output and "etc_link" in out.output


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def build(:\n", "SyntaxError"),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("import sys\nsys.exit(0)\n", "SystemExit"),
        ("def build():\n    raise SystemExit(0)\n", "SystemExit"),
        ("def build():\n    return {}['model']\n", "KeyError"),
    ],
)
def test_a_workload_that_fails_is_one_line_naming_the_file_and_line(tmp_path, monkeypatch, source, says):
    monkeypatch.chdir(tmp_path)  # a workload file beside the spec, as the README shows
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "broken_wl.py").write_text(source)
    spec = tmp_path / "s.yaml"
    spec.write_text('name: x\nworkers: [2]\nworkload: "broken_wl:build"\n')
    sys.modules.pop("broken_wl", None)
    # planning imports and builds it (a dry run runs no workload code), and fails before anything starts
    out = CliRunner().invoke(app, ["run", str(spec), "--results", str(tmp_path / "r")])
    sys.modules.pop("broken_wl", None)
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert out.exit_code == 2 and len(lines) == 1, out.output
    assert lines[0].startswith("error: workload:") and says in lines[0] and "broken_wl.py" in lines[0]
    assert "line " in lines[0]


def test_a_typeerror_inside_a_factory_is_not_blamed_on_its_arguments(tmp_path, monkeypatch):
    from trainers.config import StepConfig
    from trainers.workload import create

    (tmp_path / "typo_wl.py").write_text("def build(width=4):\n    return len(width)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as inside:
        create(StepConfig(workload="typo_wl:build", workload_args='{"width": 3}'))
    assert inside.value.field == "workload" and "TypeError" in inside.value.allowed
    with pytest.raises(ConfigError) as args:
        create(StepConfig(workload="typo_wl:build", workload_args='{"depth": 3}'))
    assert args.value.field == "workload_args"


@pytest.mark.parametrize(("workdir", "says"), [("/", "filesystem root"), ("/nonexistent/x", "an existing folder")])
def test_submit_checks_its_workdir_before_contacting_the_cluster(tmp_path, workdir, says):
    spec = tmp_path / "s.yaml"
    spec.write_text('name: x\nworkers: [2]\nworkload: "mine.models:build"\n')
    out = CliRunner().invoke(app, ["submit", str(spec), "--workdir", workdir, "--dashboard", "http://127.0.0.1:9"])
    assert out.exit_code == 2 and out.output.startswith("error: --workdir") and says in out.output


def test_the_recsys_example_shards_its_rows_into_tables_and_refuses_a_count_that_does_not_divide_them():
    from trainers.config import StepConfig
    from trainers.workload import create

    built = create(StepConfig(workload="sweeps.examples.recsys:build", workload_args='{"rows": 12, "tables": 3}'))
    shapes = [tuple(p.shape) for n, p in built.model.named_parameters() if n.startswith("tables.")]
    assert shapes == [(4, 32)] * 3 and built.rows == 4  # ids index within one table
    with pytest.raises(ConfigError) as bad:
        create(StepConfig(workload="sweeps.examples.recsys:build", workload_args='{"rows": 10, "tables": 3}'))
    assert bad.value.field == "workload" and "tables: 3" in bad.value.allowed
