#!/usr/bin/env python3
"""A DataLoader failure that is NOT about /dev/shm size: the open-files limit.

With PyTorch's default sharing strategy every tensor a worker sends arrives
as a file descriptor (SCM_RIGHTS) and the trainer keeps one fd per received
tensor for as long as the tensor lives. This trainer keeps every batch (say,
to collect outputs for evaluation) and each batch holds --tensors-per-batch
small tensors, under a low RLIMIT_NOFILE (--nofile). /dev/shm stays mostly
empty; the fd table fills up instead:

- recvmsg() has no slot for the incoming fd: the kernel drops it and sets
  MSG_CTRUNC, Python raises "RuntimeError: received 0 items of ancdata";
- the trainer then probes with 10 temporary files, gets EMFILE, and raises
  PyTorch's "RuntimeError: Too many open files. Communication with the
  workers is no longer possible. ..." (exit status 1);
- with --pin-memory the receiving thread is `pt_data_pin`: it dies with
  "received 0 items of ancdata" and the trainer raises "Pin memory thread
  exited unexpectedly".

A bigger /dev/shm does not help; a bigger --nofile (ulimit -n) does
(--required-nofile prints the value that suffices).

    python3 fd_limit.py --nofile 64 --tensors-per-batch 8 --batches 16
"""

import argparse
import resource
import sys

import _dataloader as dl
from _workload import add_required_flag, print_required


def required_nofile(cfg):
    """The trainer's own fds (stdio, the queues' pipes, worker sentinels,
    about 32 in all) plus one per kept tensor."""
    return 32 + 3 * cfg.workers + cfg.batches * cfg.epochs * cfg.tensors_per_batch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    dl.add_loader_flags(p, batch_bytes_default=32 * 1024)
    p.set_defaults(tensors_per_batch=8, batches=16, step_ms=20)
    p.add_argument("--nofile", type=int, default=64,
                   help="soft RLIMIT_NOFILE for the trainer and its workers (ulimit -n)")
    p.add_argument("--required-nofile", action="store_true",
                   help="print the --nofile value this invocation needs, and exit")
    add_required_flag(p)
    cfg = p.parse_args()
    cfg.alloc, cfg.errno_bug = "fallocate", "none"
    if cfg.required_nofile:
        print(required_nofile(cfg))
        return 0
    # every kept batch stays in /dev/shm, plus those in flight
    print_required(cfg, (cfg.batches * cfg.epochs + cfg.workers * cfg.prefetch_factor + 1)
                   * dl.batch_pages(cfg) + dl.sem_pages(cfg))

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg.nofile, hard))

    kept = []
    for epoch in range(cfg.epochs):
        for batch in dl.DataLoaderIter(cfg, cfg.batches):
            dl.train_step(cfg, batch)
            kept.append(batch)
        print(f"epoch {epoch}: kept {len(kept)} batches "
              f"({len(kept) * cfg.tensors_per_batch} shared tensors)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
