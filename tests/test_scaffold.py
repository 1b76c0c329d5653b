"""`ddpsweep init` writes its two starter files into a folder, both or neither, never through a link or over a
file, with one line per failure and a next step that works from where the user stands."""

from __future__ import annotations

import os
import shlex
import subprocess

from typer.testing import CliRunner

from service.cli import app
from service.scaffold import STARTER


def init(cwd, *args: str):
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, ["init", *args])
    finally:
        os.chdir(here)


def test_a_dangling_link_is_refused_not_written_through(tmp_path):
    (tmp_path / "spec.yaml").symlink_to(tmp_path / "outside.yaml")
    out = init(tmp_path)
    assert out.exit_code == 2 and "already there" in out.output and "follows a link" in out.output
    assert not (tmp_path / "outside.yaml").exists() and not (tmp_path / "my_workload.py").exists()


def test_a_folder_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "sub").write_text("x")
    out = init(tmp_path, "sub")
    lines = out.output.strip().splitlines()
    assert out.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: sub: not a folder")
    assert "Traceback" not in out.output


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    target = tmp_path / "ro"
    target.mkdir(mode=0o555)
    if os.access(target, os.W_OK):  # root writes anyway: a folder on a read-only filesystem instead
        target = "/proc/ddpsweep-init"
    out = init(tmp_path, str(target))
    assert out.exit_code == 2 and "cannot write" in out.output and len(out.output.strip().splitlines()) == 1


def test_a_failure_on_the_second_file_leaves_nothing_and_a_rerun_works(tmp_path, monkeypatch):
    import builtins

    real_open = builtins.open

    def full_on_second(path, mode="r", *a, **k):
        if str(path).endswith(STARTER[1]) and "x" in mode:
            raise OSError(28, "No space left on device", str(path))
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", full_on_second)
    out = init(tmp_path)
    assert out.exit_code == 2 and "No space left on device" in out.output and "nothing was written" in out.output
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(builtins, "open", real_open)
    assert init(tmp_path).exit_code == 0 and sorted(p.name for p in tmp_path.iterdir()) == sorted(STARTER)


def test_the_next_step_works_from_where_the_user_stands(tmp_path):
    out = init(tmp_path, "my study")
    assert out.exit_code == 0, out.output
    step = out.output.split("next: ", 1)[1].split("   ", 1)[0]
    assert shlex.split(step) == ["cd", "my study", "&&", "ddpsweep", "run", "spec.yaml", "--dry-run"]
    assert subprocess.run(["bash", "-n", "-c", step]).returncode == 0
    (tmp_path / "here").mkdir()
    here = init(tmp_path / "here")
    assert "next: ddpsweep run spec.yaml --dry-run" in here.output  # in the folder itself: no cd
