"""The storm test, short: a jobs=2 sweep under 8 random faults (every kind that can run here)
ends with every run folder and the report's tables identical to an undisturbed sweep's.
`just chaos` is the long one (30 faults)."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reliability import chaos, compare
from qkstudy import files, run_folder

# 4 grid runs + 2 refinement runs of 20 steps, mini-shaped
WORDS = [w for w in chaos.SWEEP if not w.startswith(("seeds=", "max_steps="))] + [
    "seeds=0", "max_steps=20"]


def test_a_storm_of_faults_ends_bit_identical(tiny_data, tmp_path):
    # seed 2: a storm of it interrupted a run in the log interval where the run diverged (the
    # failure tests/test_train_resume.py reproduces)
    result = chaos.storm(faults=8, seed=2, work=tmp_path, sweep_words=WORDS, data=tiny_data)
    print(result.table())
    assert result.ok, result.differences
    ran = [k for k in chaos.KINDS if k not in result.skipped]
    assert set(result.skipped) <= {"disk_full"}  # the only kind that needs something (root)
    assert all(result.injected[k] >= 1 for k in ran), result.injected
    # 8 in the storm, then the report onto a full disk once
    assert sum(result.injected.values()) == 9 and result.final_invocations >= 1

    # the comparison sees a changed loss and a changed weight (a storm that broke them fails)
    ref = tmp_path / "reference" / chaos.NAME
    run = compare.run_folders(ref)[0]
    changed = tmp_path / "changed"
    shutil.copytree(ref / run, changed / run)
    assert compare.compare_run(ref / run, changed / run) == []
    part = run_folder.parts(changed / run / "metrics")[-1][1]
    table = pq.read_table(part)
    losses = table.column("train_loss")
    table = table.set_column(table.schema.get_field_index("train_loss"), "train_loss",
                             pc.add(losses, 1e-6))
    pq.write_table(table, part)
    weights, meta = files.read_tensors(ref / run / "final.safetensors")
    name = sorted(weights)[0]
    weights[name] = np.nextafter(weights[name], np.inf).astype(weights[name].dtype)
    files.save_tensors(changed / run / "final.safetensors", weights,
                        {k: v for k, v in meta.items() if k != "sha256"})
    assert compare.compare_run(ref / run, changed / run) == [
        f"{run}: metrics rows differ", f"{run}: final weights differ"]
