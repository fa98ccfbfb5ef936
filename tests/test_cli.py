"""Every command answers --help in one style (usage line first, exit 0) and writes nothing."""

from __future__ import annotations

import pytest

from qkstudy.__main__ import main as mlx_main
from crosscheck.__main__ import main as crosscheck_main

COMMANDS = [(mlx_main, c) for c in ("prepare", "train", "sweep", "bench", "status")] + [
    (crosscheck_main, c) for c in ("parity", "spot-check")]


@pytest.mark.parametrize("main,command", COMMANDS, ids=[c for _, c in COMMANDS])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help(main, command, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([command, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m ") and f" {command}" in out.splitlines()[0]
    assert list(tmp_path.iterdir()) == []  # help writes nothing


def test_train_help_lists_every_key_with_its_default(capsys):
    from dataclasses import fields

    from qkstudy.config import TrainConfig

    assert mlx_main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for f in fields(TrainConfig):
        assert f"{f.name}={f.default}" in out, f.name
