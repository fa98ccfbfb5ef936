"""What the sweep tests share: the words of a sweep of tiny runs, a run's status, and a stub
trainer whose runs diverge above a threshold LR."""

from __future__ import annotations

from pathlib import Path

from qkstudy import files, trainer
from qkstudy.run_folder import RunFolder


def tiny_words(data: str, runs_dir: Path, *extra: str) -> list[str]:
    """A sweep of tiny runs (depth 1, d_model 32, 20 steps): about a second each here. `extra`
    words replace the defaults of the same key (a key may be given once)."""
    words = dict(w.split("=", 1) for w in (
        "preset=demo", f"data={data}", f"runs_dir={runs_dir}", "name=t", "depth=1", "d_model=32",
        "n_heads=2", "block_size=32", "batch_size=4", "max_steps=20", "warmup_steps=5",
        "eval_every=10", "eval_batches=2", "probe_every=10", "log_every=5", "ckpt_every=10",
        "arms=none", "seeds=0", "jobs=1", "divergence_window=5"))
    words.update(w.split("=", 1) for w in extra if "=" in w)
    return [f"{k}={v}" for k, v in words.items()] + [w for w in extra if "=" not in w]


def status_of(cfg) -> str | None:
    return (files.read_json(RunFolder.of(cfg).path / "summary.json") or {}).get("status")


def fake_trainer(monkeypatch, threshold: dict[str, float], calls: list):
    """Replace train.train by a stub that writes a summary: stable iff lr < threshold[qk_norm]."""

    def fake(cfg, verbose=True, prefix="", repair=None, started=None):
        calls.append((cfg, prefix))
        if started:
            started()
        status = "completed" if cfg.lr < threshold[cfg.qk_norm] else "diverged"
        folder = RunFolder.of(cfg).path
        folder.mkdir(parents=True, exist_ok=True)
        summary = {"run_id": cfg.run_id, "status": status, "tokens_seen": 100, "steps": 1}
        files.write_json(folder / "summary.json", summary)
        return summary

    monkeypatch.setattr(trainer, "train", fake)
    # the stub writes no logs, which the integrity check of finished runs would find damaged
    # (and the sweep would repair): a summary alone is a finished run here
    monkeypatch.setattr(RunFolder, "intact_summary", RunFolder.finished)
