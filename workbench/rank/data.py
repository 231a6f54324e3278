"""Datasets made locally from the seed, with a learnable signal, and sharding across ranks.

Labels come from a fixed random "teacher" (or, for the language model, a fixed random Markov
chain), so loss and accuracy mean something: a model that learns beats chance.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, DistributedSampler, default_collate

from workbench.config.choices import HF_PREFIX
from workbench.config.run_config import RunConfig
from workbench.rank.models import load_plugin


class TensorPairDataset(Dataset):
    """Inputs and targets held as two tensors; batches are fetched by tensor indexing."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        assert len(inputs) == len(targets)
        self.tensors = (inputs, targets)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensors[0][i], self.tensors[1][i]


def _teacher_labels(features: torch.Tensor, num_classes: int, gen: torch.Generator) -> torch.Tensor:
    """Labels from a fixed random two-layer teacher, balanced enough to be learnable."""
    hidden = torch.randn(features.shape[1], 4 * num_classes, generator=gen)
    out = torch.randn(4 * num_classes, num_classes, generator=gen)
    return (torch.tanh(features @ hidden) @ out).argmax(dim=1)


def synthetic_dataset(
    model: str, opts: dict[str, Any], n: int, seed: int, split: int
) -> TensorPairDataset:
    """``n`` samples of a built-in model's synthetic data (``opts``: its model options), split 0
    (train) or 1 (eval): the same labelling teacher for both splits, different inputs."""
    teacher = torch.Generator().manual_seed(seed * 7919 + 17)  # same teacher for both splits
    gen = torch.Generator().manual_seed(seed * 7919 + 1000 + split)
    if model in ("mlp", "planted"):
        x = torch.randn(n, opts["input_dim"], generator=gen)
        return TensorPairDataset(x, _teacher_labels(x, opts["num_classes"], teacher))
    if model == "cnn":
        s, c = opts["image_size"], opts["channels"]
        x = torch.randn(n, c, s, s, generator=gen)
        pooled = torch.nn.functional.adaptive_avg_pool2d(x, 2).flatten(1)
        return TensorPairDataset(x, _teacher_labels(pooled * 2.0, opts["num_classes"], teacher))
    if model == "transformer":
        ids = torch.randint(opts["vocab_size"], (n, opts["seq_len"]), generator=gen)
        token_scores = torch.randn(opts["vocab_size"], opts["num_classes"], generator=teacher)
        return TensorPairDataset(ids, token_scores[ids].sum(dim=1).argmax(dim=1))
    if model == "gpt":
        v, t = opts["vocab_size"], opts["seq_len"]
        # Each token is followed by one of 4 likely successors: a learnable next-token signal.
        successors = torch.randint(v, (v, 4), generator=teacher)
        seq = torch.empty(n, t + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(v, (n,), generator=gen)
        for i in range(t):
            pick = torch.randint(4, (n,), generator=gen)
            seq[:, i + 1] = successors[seq[:, i], pick]
        return TensorPairDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
    raise ValueError(
        f"dataset='synthetic' has no generator for model={model!r}; give a dataset plug-in"
    )


def build_datasets(config: RunConfig, rank: int = 0, processes: int = 1) -> tuple[Dataset, Dataset]:
    """(train, eval) datasets for a config: synthetic for built-in models, this rank's row groups
    of a Parquet file, or the plug-in's."""
    if config.dataset == "parquet":
        opts = config.dataset_options
        return (
            parquet_dataset(opts["train"], rank, processes),
            parquet_dataset(opts["eval"], all_groups=True),
        )
    if config.dataset == "synthetic":
        kind, opts = config.model, config.model_kwargs
        if kind.startswith(HF_PREFIX):
            from workbench.rank.hf_models import hf_data_options

            kind, opts = hf_data_options(config.model, dict(config.model_options))
        return (
            synthetic_dataset(kind, opts, config.train_samples, config.seed, split=0),
            synthetic_dataset(kind, opts, config.eval_samples, config.seed, split=1),
        )
    factory = load_plugin(config.dataset, "dataset")
    result = factory(
        train_samples=config.train_samples,
        eval_samples=config.eval_samples,
        seed=config.seed,
        **config.dataset_options,
    )
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError(
            f"dataset={config.dataset!r}: the factory must return (train_dataset, eval_dataset)"
        )
    return result


def fetch_batch(dataset: Dataset, indices: Sequence[int]) -> Any:
    """One batch by index: tensor indexing when the dataset holds tensors, else collate items."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return tuple(t[idx] for t in tensors)
    return default_collate([dataset[i] for i in indices])


def train_batches(
    dataset: Dataset, rank: int, world_size: int, batch_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """This rank's batches of dataset indices for one epoch.

    A DistributedSampler reshuffled per epoch gives each rank a disjoint shard (``drop_last`` keeps
    shards equal without repeating samples); incomplete batches are dropped so every step of every
    rank sees a full per-device batch. A dataset that is already this rank's shard (Parquet row
    groups) is only reshuffled.
    """
    if getattr(dataset, "local_shard", False):
        g = torch.Generator().manual_seed(seed + epoch)
        indices = torch.randperm(len(dataset), generator=g).tolist()  # type: ignore[arg-type]
    else:
        sampler: DistributedSampler[int] = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        sampler.set_epoch(epoch)
        indices = list(sampler)
    usable = len(indices) - len(indices) % batch_size
    return [indices[i : i + batch_size] for i in range(0, usable, batch_size)]


def dropped_per_epoch(
    dataset: Dataset, rank: int, world_size: int, batch_size: int, batches: int
) -> int:
    """Training samples of one epoch this rank accounts for but never trains on, when it trains
    ``batches`` batches of ``batch_size``: what is left of its shard (incomplete batches, and
    batches beyond the epoch's steps), and, on rank 0, what the sampler drops to make the
    shards equal. Summed over ranks: the run's samples dropped per epoch."""
    n = len(dataset)  # type: ignore[arg-type]
    if getattr(dataset, "local_shard", False):
        return max(0, n - batches * batch_size)
    share = n // world_size  # DistributedSampler(drop_last=True)
    dropped = max(0, share - batches * batch_size)
    return dropped + (n - share * world_size if rank == 0 else 0)


def eval_shard(
    dataset: Dataset, rank: int, world_size: int, batch_size: int
) -> Iterator[list[int]]:
    """This rank's evaluation batches. The sampler pads by repeating samples so every rank runs
    the same number of collectives; the gather on rank 0 removes the repeats by index."""
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=False
    )
    indices = list(sampler)
    for i in range(0, len(indices), batch_size):
        yield indices[i : i + batch_size]


def parquet_dataset(
    path: str | Path, rank: int = 0, world_size: int = 1, all_groups: bool = False
) -> Any:
    """This rank's row groups (or the whole file) as a dataset of (features, label) tensors."""
    file = pq.ParquetFile(path)
    groups = list(range(file.num_row_groups))
    mine = groups if all_groups else groups[rank::world_size]
    table = file.read_row_groups(mine)
    names = [c for c in table.column_names if c != "label"]
    x = np.stack([table.column(c).to_numpy() for c in names], axis=1).astype(np.float32)
    y = table.column("label").to_numpy().astype(np.int64)
    dataset = TensorPairDataset(torch.from_numpy(x), torch.from_numpy(y))
    # Already this rank's data: train_batches only reshuffles it.
    dataset.local_shard = not all_groups  # type: ignore[attr-defined]
    return dataset
