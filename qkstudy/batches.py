"""Batches as a pure function of (data_seed, purpose, index): the same for every arm and LR."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .config import TrainConfig

TRAIN, VAL, PROBE = 0, 1, 2  # the stream a batch belongs to, mixed into its seed


def sample_batch(tokens: np.ndarray, seed: list[int], batch_size: int,
                 block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows of block_size+1 tokens -> inputs, targets (int32, (B, T))."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)
    window = tokens[starts[:, None] + np.arange(block_size + 1)].astype(np.int32)
    return window[:, :-1], window[:, 1:]


def train_batch(tokens: np.ndarray, data_seed: int, step: int, batch_size: int,
                block_size: int) -> tuple[np.ndarray, np.ndarray]:
    return sample_batch(tokens, [data_seed, TRAIN, step], batch_size, block_size)


def val_batches(tokens: np.ndarray, data_seed: int, n: int, batch_size: int,
                block_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [sample_batch(tokens, [data_seed, VAL, i], batch_size, block_size) for i in range(n)]


def probe_batch(tokens: np.ndarray, data_seed: int, batch_size: int,
                block_size: int) -> tuple[np.ndarray, np.ndarray]:
    return sample_batch(tokens, [data_seed, PROBE, 0], batch_size, block_size)


def train_stream(tokens: np.ndarray, data_seed: int, start: int, stop: int, batch_size: int,
                 block_size: int, prefetch: int = 4) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches for steps start..stop-1, built `prefetch` steps ahead on a worker thread."""
    def make(step: int) -> tuple[np.ndarray, np.ndarray]:
        return train_batch(tokens, data_seed, step, batch_size, block_size)

    with ThreadPoolExecutor(max_workers=1) as pool:
        queue = deque(pool.submit(make, s) for s in range(start, min(stop, start + prefetch)))
        upcoming = start + len(queue)
        while queue:
            batch = queue.popleft().result()
            if upcoming < stop:
                queue.append(pool.submit(make, upcoming))
                upcoming += 1
            yield batch


def random_batch(cfg: TrainConfig, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of uniform random token ids, int32, of the config's batch shape."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (cfg.batch_size, cfg.block_size + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]
