#!/usr/bin/env python3
"""PyTorch <= 2.9: a DataLoader worker dies of SIGBUS when /dev/shm fills up.

Before 2.10, ATen's MapAllocator sized the shared file with ftruncate (sparse,
never fails) and write(fd, "", 1) (one page), then mapped it. Nothing reserves
the pages, so when the worker collates the batch into the mapping and tmpfs has
no page left, the store faults: SIGBUS (BUS_ADRERR, address in the
/dev/shm/torch_* mapping). The worker's handler prints
"ERROR: Unexpected bus error encountered in worker. This might be caused by
insufficient shared memory (shm).", resets SIGBUS to SIG_DFL and raises it
again (tgkill), so the worker is killed by signal 7. The trainer's SIGCHLD
handler reports "DataLoader worker (pid N) is killed by signal: Bus error."
and the trainer exits 1. (If tmpfs is 100% full when a batch starts, the
1-byte write fails instead: "unable to write to file </torch_...>: No space
left on device (28)".)

    python3 pytorch_mmap_sigbus.py --batch-bytes 384K --workers 2 --prefetch-factor 2
"""

import argparse
import sys

import _dataloader as dl
from _workload import add_required_flag, print_required, human


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    dl.add_loader_flags(p, batch_bytes_default=384 * 1024)
    add_required_flag(p)
    cfg = p.parse_args()
    cfg.alloc, cfg.errno_bug = "write", "none"
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
