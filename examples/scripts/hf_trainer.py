"""Fine-tuning a DistilBERT classifier with the Hugging Face Trainer, as in the scaling study of
seed 002 but small enough for a CPU: a tiny DistilBERT config (built from its config class, no
download) on synthetic token ids. torchrun (or the workbench) starts one process per device; the
Trainer finds the job in the environment and wraps the model in DistributedDataParallel itself.

    torchrun --standalone --nproc-per-node 2 examples/scripts/hf_trainer.py --steps 40
    workbench run --script examples/scripts/hf_trainer.py --world-size 2 -- --steps 40

It knows nothing of the workbench. At the end rank 0 prints the Trainer's own metrics
(``train_runtime``, ``train_samples_per_second``) and, with ``--metrics-json PATH``, writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built locally

import torch
from torch.utils.data import Dataset
from transformers import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
    Trainer,
    TrainingArguments,
)


class SyntheticTokens(Dataset):
    """Random token ids and labels, made from a seed."""

    def __init__(self, samples: int, seq_len: int, vocab: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (samples, seq_len), generator=g)
        self.labels = torch.randint(0, classes, (samples,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--per-device-batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--output-dir", help="the Trainer's folder (default: a temporary one)")
    p.add_argument("--metrics-json", help="rank 0 writes the Trainer's train metrics here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = DistilBertConfig(
        vocab_size=1000,
        dim=args.dim,
        n_layers=args.layers,
        n_heads=2,
        hidden_dim=4 * args.dim,
        max_position_embeddings=args.seq_len,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = DistilBertForSequenceClassification(config)
    samples = args.per_device_batch_size * world_size * args.steps
    dataset = SyntheticTokens(samples, args.seq_len, config.vocab_size, config.num_labels)
    cpu = not torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as scratch:
        training = TrainingArguments(
            output_dir=args.output_dir or scratch,
            max_steps=args.steps,
            per_device_train_batch_size=args.per_device_batch_size,
            learning_rate=args.lr,
            logging_steps=10,
            save_strategy="no",
            eval_strategy="no",
            report_to=[],
            dataloader_num_workers=0,
            use_cpu=cpu,
            ddp_backend="gloo" if cpu else None,
            seed=0,
            disable_tqdm=True,  # a log per rank, not a progress bar
        )
        trainer = Trainer(model=model, args=training, train_dataset=dataset)
        metrics = trainer.train().metrics
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(metrics), flush=True)
        if args.metrics_json:
            with open(args.metrics_json, "w") as f:
                json.dump(metrics, f)


if __name__ == "__main__":
    main()
