"""Text for people: a training run's progress line, durations, Markdown tables."""

from __future__ import annotations

import math
import sys
import time


class Display:
    """One live line on a terminal, else a plain line every ~30 s."""

    def __init__(self, run_id: str, steps: int, tokens_per_step: int, enabled: bool = True,
                 prefix: str = ""):
        self.run_id, self.steps, self.enabled, self.prefix = run_id, steps, enabled, prefix
        self.tokens_per_step, self.origin = tokens_per_step, None
        self.tty = sys.stdout.isatty()
        self.last_print = 0.0

    def update(self, step: int, loss: float, train_seconds: float, val: float | None) -> None:
        """The rate counts from the first update on: the first interval holds compilation, and
        a resumed run's clock holds the seconds before its checkpoint."""
        if not self.enabled:
            return
        self.origin = self.origin or (step, train_seconds)
        done, seconds = step - self.origin[0], train_seconds - self.origin[1]
        tok_s = done * self.tokens_per_step / seconds if done and seconds > 0 else math.nan
        eta_s = (self.steps - step) * self.tokens_per_step / tok_s
        rate = "?" if math.isnan(tok_s) else f"{tok_s:,.0f}"
        val_text = f" val {val:.3f}" if val is not None else ""
        line = (f"{self.prefix}{self.run_id} step {step}/{self.steps} loss {loss:.4f}{val_text} "
                f"{rate} tok/s ETA {format_seconds(eta_s)}")
        if self.tty:
            print("\r\033[K" + line, end="", flush=True)
        elif time.monotonic() - self.last_print > 30:
            print(line, flush=True)
            self.last_print = time.monotonic()

    def begin(self, message: str, always: bool = False) -> None:
        if self.tty or always:
            self.close(message, end="" if self.tty else "\n")

    def close(self, message: str, end: str = "\n") -> None:
        if self.enabled:
            print(("\r\033[K" if self.tty else "") + f"{self.prefix}{self.run_id} {message}",
                  end=end, flush=True)


def format_seconds(s: float | None) -> str:
    """1m05s, 2h07m; "?" for an unknown time (None, inf, nan)."""
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(row) + " |" for row in [head, ["---"] * len(head), *rows]]
