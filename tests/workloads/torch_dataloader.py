#!/usr/bin/env python3
"""A real PyTorch DataLoader (torch from PyPI) passing batches through /dev/shm.

Each batch is one float32 tensor of --batch-bytes, made by --workers worker
processes with --prefetch batches queued per worker; the trainer takes --step
seconds per batch, so the workers run ahead as far as prefetch_factor lets
them. --strategy file_system passes batches by name instead of by
descriptor. When /dev/shm is too small, PyTorch raises (ENOSPC from fallocate in a
worker, or the worker dies of SIGBUS; a batch lost in a worker's queue feeder
thread shows as the DataLoader's timeout) and this exits 1. --hold-after K stops
taking batches after K, waits until the workers have filled their queues (their
batches in /dev/shm), says so by creating --ready, and waits to be killed: the
batches in flight of a job killed at once (docker kill, the OOM killer's
cgroup-wide kill). Needs the venv of tests/src/pytorch.rs.

    /opt/shmtrace-venv/bin/python torch_dataloader.py --workers 2 --batch-bytes 4M
"""

import argparse
import glob
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from _workload import parse_size


class Batches(Dataset):
    def __init__(self, n, elements):
        self.n, self.elements = n, elements

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.elements,), float(i))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-bytes", type=parse_size, default=4 << 20)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--step", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds the trainer waits for a batch before giving up")
    p.add_argument("--strategy", choices=["file_descriptor", "file_system"],
                   default="file_descriptor",
                   help="torch.multiprocessing's sharing strategy: batches travel by descriptor "
                        "(one unlinked /dev/shm file each), or by name (file_system: one named "
                        "file each, and a torch_shm_manager per worker)")
    p.add_argument("--hold-after", type=int, default=0,
                   help="after this many batches, fill the queues, create --ready and wait")
    p.add_argument("--ready", help="the file --hold-after creates")
    args = p.parse_args()
    torch.multiprocessing.set_sharing_strategy(args.strategy)
    loader = DataLoader(Batches(args.batches, args.batch_bytes // 4), batch_size=None,
                        num_workers=args.workers, prefetch_factor=args.prefetch,
                        # A worker whose batch cannot be put in /dev/shm fails in its queue's
                        # feeder thread, and the trainer would wait for that batch forever.
                        timeout=args.timeout)
    total = 0.0
    try:
        for n, batch in enumerate(loader, 1):
            total += float(batch[0])
            time.sleep(args.step)
            if n == args.hold_after:
                hold(args)
    except RuntimeError as e:
        print(f"DataLoader failed: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"{args.batches} batches, checksum {total}")


def hold(args):
    """Waits (up to a minute) until the workers' queued batches are in /dev/shm, says so,
    and waits to be killed."""
    queued = args.workers * args.prefetch
    deadline = time.monotonic() + 60
    while len(glob.glob("/dev/shm/torch_*")) < queued and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"holding {len(glob.glob('/dev/shm/torch_*'))} batches in /dev/shm", flush=True)
    open(args.ready, "w").close()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
