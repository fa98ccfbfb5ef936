"""How much QK-norm's placement changes the attention logits at the same weights: per head over
head_dim (Qwen3, this project) against the full q and k projections, width d_model, before the
head split (OLMo 2). Prints the median and range over 20 weight draws of
||logits_per_head - logits_full_width|| / ||logits_per_head|| (docs/model.md quotes it).

    python -m tools.qk_placement
"""

from __future__ import annotations

import numpy as np

from qkstudy.config import NORM_EPS


def rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + NORM_EPS)


def logits(q: np.ndarray, k: np.ndarray, heads: int, full_width: bool) -> np.ndarray:
    """(heads, T, T) scaled logits with RMS QK-norm (gains 1) before or after the head split."""
    t, d = q.shape
    if full_width:
        q, k = rms(q), rms(k)
    q, k = (a.reshape(t, heads, d // heads).transpose(1, 0, 2) for a in (q, k))
    if not full_width:
        q, k = rms(q), rms(k)
    return q @ k.transpose(0, 2, 1) / np.sqrt(d // heads)


def relative_change(d_model: int, heads: int, head_spread: float, seed: int) -> float:
    """At weights drawn iid N(0, 1/d_model), each head's q and k columns scaled by
    exp(N(0, head_spread)) (0: as initialised; > 0: heads of different sizes, as training makes)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, d_model))
    scale = np.repeat(np.exp(rng.standard_normal(heads) * head_spread), d_model // heads)
    wq, wk = (rng.standard_normal((d_model, d_model)) / np.sqrt(d_model) * scale for _ in "qk")
    a, b = (logits(x @ wq, x @ wk, heads, full) for full in (False, True))
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def main() -> None:
    for d_model, heads, name in ((64, 2, "mini"), (192, 3, "study")):
        for spread in (0.0, 0.5):
            r = [relative_change(d_model, heads, spread, s) for s in range(20)]
            print(f"{name} (d_model {d_model}, {heads} heads), head spread {spread}: median "
                  f"{np.median(r):.2f} ({min(r):.2f}-{max(r):.2f})")


if __name__ == "__main__":
    main()
