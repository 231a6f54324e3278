"""Training a small GPT-2 language model with Hugging Face Accelerate and gradient accumulation,
in the shape of the Accelerate scripts of seed 002: the Accelerator finds the job in the
environment torchrun sets, ``prepare`` wraps the model in DistributedDataParallel and shards the
data, ``accumulate`` skips the gradient sync on all but the last micro-batch of each step.

    torchrun --standalone --nproc-per-node 2 examples/scripts/accelerate_gpt2.py --steps 20
    workbench run --script examples/scripts/accelerate_gpt2.py --world-size 2 -- --steps 20

It knows nothing of the workbench. A tiny GPT-2 config is built from its config class (no
download) and fed synthetic token ids.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built locally

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--per-device-batch-size", type=int, default=8, help="per micro-batch")
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(), gradient_accumulation_steps=args.grad_accum
    )
    config = GPT2Config(
        vocab_size=1000,
        n_positions=args.seq_len,
        n_embd=args.n_embd,
        n_layer=args.layers,
        n_head=2,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    micro_batches = args.steps * args.grad_accum * accelerator.num_processes
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(
        0,
        config.vocab_size,
        (micro_batches * args.per_device_batch_size, args.seq_len),
        generator=g,
    )
    loader = DataLoader(TensorDataset(ids), batch_size=args.per_device_batch_size, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    step = 0
    for (batch,) in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            if step % 10 == 0:
                accelerator.print(f"step {step}: loss {loss.item():.4f}")
            if step == args.steps:
                break
    accelerator.print(f"{step} optimizer steps on {accelerator.num_processes} process(es)")
    accelerator.end_training()


if __name__ == "__main__":
    main()
