"""`python -m mlx_gpt.memory_bench [demo mini study ...]`: the memory estimate against the peak.

For each preset's shape (its largest depth), in a fresh process: qkstudy/memory.py's estimate,
MLX's peak memory (mx.get_peak_memory) over two compiled training steps, and the process's
peak RSS (which also counts the interpreter, MLX itself and the batches). Prints a Markdown
table for docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from qkstudy.memory import estimate, format_bytes


def shapes() -> dict[str, tuple[dict, int]]:
    """{preset: (its TrainConfig fields of shape, at its largest depth; vocabulary size)}."""
    from qkstudy.sweep.config import PRESETS
    from qkstudy.sweep.plan import VOCAB_BY_SUFFIX

    out = {}
    for name in ("demo", "mini", "study"):
        t = PRESETS[name].train
        shape = {k: getattr(t, k) for k in ("d_model", "n_heads", "block_size", "batch_size",
                                            "bias", "qk_norm", "kernels")}
        shape["depth"] = max(PRESETS[name].depth)
        out[name] = (shape, VOCAB_BY_SUFFIX[t.data.rsplit("-", 1)[-1]])
    return out


def measure_one(shape: dict, vocab: int) -> dict:
    """MLX's peak bytes over two compiled steps after building the model, and peak RSS."""
    import resource

    import mlx.core as mx

    from qkstudy.config import TrainConfig

    from .engine import build_model, make_train_step
    from .optim import make_optimizer

    cfg = TrainConfig(**shape)
    model = build_model(cfg, vocab)
    step, state = make_train_step(model, make_optimizer(cfg, model.parameters()), cfg.grad_clip)
    x = mx.random.randint(0, vocab, (cfg.batch_size, cfg.block_size))
    y = mx.random.randint(0, vocab, (cfg.batch_size, cfg.block_size))
    for _ in range(2):
        mx.eval(step(x, y), state)
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, kB on Linux
    return {"peak": mx.get_peak_memory(),
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help", "help") for a in argv):
        print("usage: python -m mlx_gpt.memory_bench [demo mini study ...]\n\n" + __doc__.strip())
        return 0
    if argv[:1] == ["--one"]:
        import mlx_gpt  # noqa: F401  (the fast BLAS before MLX)

        shape, vocab = json.loads(argv[1])
        print(json.dumps(measure_one(shape, vocab)))
        return 0
    known = shapes()
    names = argv or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown shape {unknown[0]!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    print("| preset shape | depth | d_model | heads | block | batch | vocab | estimate | MLX peak "
          "| estimate / peak | peak RSS | estimate / RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    from qkstudy.config import TrainConfig

    for name in names:
        shape, vocab = known[name]
        est = estimate(dataclasses.replace(TrainConfig(), **shape), vocab).total
        done = subprocess.run([sys.executable, "-m", "mlx_gpt.memory_bench", "--one",
                               json.dumps([shape, vocab])], capture_output=True, text=True)
        if done.returncode:
            print(f"error: measuring {name} failed: {done.stderr.strip().splitlines()[-1:]}",
                  file=sys.stderr)
            return 1
        m = json.loads(done.stdout.splitlines()[-1])
        print(f"| {name} | {shape['depth']} | {shape['d_model']} | {shape['n_heads']} | "
              f"{shape['block_size']} | {shape['batch_size']} | {vocab:,} | {format_bytes(est)} | "
              f"{format_bytes(m['peak'])} | {est / m['peak']:.2f} | {format_bytes(m['rss'])} | "
              f"{est / m['rss']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
