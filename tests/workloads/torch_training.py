#!/usr/bin/env python3
"""A healthy training job with real PyTorch (torch from PyPI): a tiny model trained
for a few epochs on batches made by DataLoader worker processes, which hand each
batch to the trainer through /dev/shm.

The data is a fixed random regression problem (y = x @ w + noise); the model is one
linear layer trained with SGD. Each epoch starts --workers new worker processes
(no persistent workers), which PyTorch shuts down cleanly at the end of the epoch.
Prints the loss of each epoch and exits 0 when the loss went down, 1 otherwise.
Needs the venv of tests/src/pytorch.rs.

    /opt/shmtrace-venv/bin/python torch_training.py --workers 2 --epochs 3
"""

import argparse
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.samples, args.features)
    w = torch.randn(args.features, 1)
    y = x @ w + 0.01 * torch.randn(args.samples, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    model = nn.Linear(args.features, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(args.epochs):
        total = 0.0
        for inputs, targets in loader:
            optimiser.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimiser.step()
            total += loss.item() * len(inputs)
        losses.append(total / args.samples)
        print(f"epoch {epoch}: loss {losses[-1]:.4f}", flush=True)
    sys.exit(0 if losses[-1] < losses[0] else 1)


if __name__ == "__main__":
    main()
