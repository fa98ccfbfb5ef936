"""Reliability against bad input: token ids outside the vocabulary, values that are not finite
or out of range, unwritable output folders, and a strict config file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qkstudy.errors import UsageError


# --- token ids, run files, bad input -----------------------------------------------------------

def test_token_ids_outside_the_vocabulary_are_refused(tiny_data, tmp_path, capsys):
    import shutil

    from qkstudy.__main__ import main
    from qkstudy.data.load import load_tokens

    for bad in (300, 257):  # 257..319 is the padding of the bytes vocabulary: also refused
        folder = tmp_path / f"bad{bad}-bytes"
        shutil.copytree(tiny_data, folder)
        tokens = np.memmap(folder / "train.bin", dtype="<u2", mode="r+")
        tokens[1234] = bad
        tokens.flush()
        del tokens
        with pytest.raises(UsageError, match=f"holds token id {bad}, outside the vocabulary"):
            load_tokens(folder)
    assert main(["train", f"data={folder}", f"runs_dir={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "runs").exists()
    (folder / "meta.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="holds a JSON list, not an object"):
        load_tokens(folder)


@pytest.mark.parametrize("words, message", [
    (["train", "n_heads=0"], "n_heads must be >= 1"),
    (["train", "depth=1e400"], "depth must be an integer"),
    (["train", "depth=nan"], "depth must be an integer"),
    (["train", "lr=inf"], "lr must be a finite number"),
    (["train", "lr=1e400"], "lr must be a finite number"),
    (["train", "lr=1e300"], "at most 3.4e+38"),
    (["train", "weight_decay=inf"], "weight_decay must be a finite number"),
    (["train", "eps=inf"], "eps must be a finite number"),
    (["train", "eps=1e-50"], "eps must be > 0 in float32"),
    (["train", "lr=1e-3", "lr=2e-3"], "lr is given twice"),
    (["train", "independent_wd=true", "weight_decay=0.01"], "independent_wd=true needs"),
    (["prepare", "synthetic", "size_mb=inf"], "size_mb must be > 0 and at most"),
    (["prepare", "synthetic", "size_mb=1e12"], "size_mb must be > 0 and at most"),
    (["prepare", "synthetic", "seed=1", "seed=2"], "seed is given twice"),
    (["sweep", "preset=demo", "lr_max=inf", "--dry-run"], "points_per_decade and refine_factor must be finite"),
    (["sweep", "preset=demo", "depth=nan"], "depth: 'nan' is not a finite number"),
    (["sweep", "preset=demo", "depth=1e400"], "is not a finite number"),
    (["sweep", "preset=demo", "lrs=inf"], "lrs: 'inf' is not a finite number"),
    (["sweep", "preset=demo", "points_per_decade=1e9", "--dry-run"], "more than 1000"),
    (["sweep", "preset=demo", "seeds=0", "seeds=1"], "seeds is given twice"),
])
def test_bad_values_are_one_line_exit_2(words, message, capsys, tmp_path, monkeypatch):
    from qkstudy.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert main(words) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())  # nothing written


def test_unwritable_output_folders_are_one_line(tiny_data, tmp_path, capsys):
    from analysis.__main__ import main as analysis_main
    from qkstudy.__main__ import main

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for runs_dir in ("/proc/x", str(a_file)):
        assert main(["train", f"data={tiny_data}", f"runs_dir={runs_dir}", "max_steps=1"]) == 2
        err = capsys.readouterr().err
        assert "cannot write run folder" in err and err.count("\n") == 1, err
    assert analysis_main(["report", str(tmp_path), "out=/proc/x"]) == 2
    assert "cannot write the report to /proc/x" in capsys.readouterr().err


def test_independent_wd_defaults_to_1e_4_and_load_config_is_strict(tmp_path):
    from qkstudy.config import TrainConfig, load_config, parse_train_config

    assert parse_train_config(["independent_wd=true"]).weight_decay == 1e-4
    assert parse_train_config([]).weight_decay == 0.1
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TrainConfig().identity(), "run_id": "x", "colour": "red"}))
    with pytest.raises(UsageError, match="unknown keys colour"):
        load_config(str(path))
    path.write_text(json.dumps({**TrainConfig().identity(), "depth": "six"}))
    with pytest.raises(UsageError, match="depth='six' is not a valid value"):
        load_config(str(path))
    path.write_text(json.dumps({**TrainConfig().identity(), "run_id": "x"}))
    assert load_config(str(path)) == TrainConfig()
