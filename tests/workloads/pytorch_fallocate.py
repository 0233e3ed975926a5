#!/usr/bin/env python3
"""Current PyTorch (>= 2.10): DataLoader workers run out of /dev/shm in fallocate.

A trainer iterates a DataLoader with --workers worker processes. Each worker
(comm `pt_data_worker`) collates every batch into /dev/shm/torch_<pid>_<u32>_<n>:
openat(O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, 0600), ftruncate,
fallocate(fd, 0, 0, size), write(fd, "", 1), mmap, unlink, then sends the fd to
the trainer (SCM_RIGHTS), which maps it too. When /dev/shm cannot hold the
prefetched batches, fallocate fails with ENOSPC; the worker's RuntimeError
travels to the trainer, which raises
"RuntimeError: Caught RuntimeError in DataLoader worker process K." and exits 1.

    python3 pytorch_fallocate.py --batch-bytes 256K --workers 2 --prefetch-factor 2
"""

import argparse
import sys

import _dataloader as dl
from _workload import add_required_flag, print_required, human


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    dl.add_loader_flags(p, batch_bytes_default=256 * 1024)
    p.add_argument("--errno-bug", choices=["none", "stale", "ignored"], default="none",
                   help="PyTorch 2.10/2.11 read errno, not posix_fallocate's return: "
                        "'stale' prints 'Resource temporarily unavailable (11)' for an "
                        "ENOSPC; 'ignored' carries on and the worker dies of SIGBUS later")
    add_required_flag(p)
    cfg = p.parse_args()
    cfg.alloc = "fallocate"
    print_required(cfg, dl.required_shm(cfg))

    for epoch in range(cfg.epochs):
        n = 0
        for batch in dl.DataLoaderIter(cfg, cfg.batches):
            dl.train_step(cfg, batch)
            n += 1
        print(f"epoch {epoch}: {n} batches of {human(cfg.batch_bytes)} "
              f"from {cfg.workers} workers", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
