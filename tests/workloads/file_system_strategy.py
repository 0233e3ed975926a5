#!/usr/bin/env python3
"""PyTorch's `file_system` sharing strategy: /dev/shm objects keep their names.

torch.multiprocessing.set_sharing_strategy("file_system") is the usual fix for
"Too many open files": tensors travel by name instead of by fd. Each worker
starts a `torch_shm_manager` daemon (comm `torch_shm_manag`, its own session)
and registers every name with it. A batch is
/dev/shm/torch_<pid>_<u32>_<n>, sized batch + 64 bytes (refcount header):
openat(O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, 0600), ftruncate,
fallocate, write 1 byte, mmap, close -- and no unlink. The trainer opens it by
name (openat O_RDWR|O_NOFOLLOW|O_CLOEXEC), maps it, and unlinks it when it
drops the last reference. So `ls /dev/shm` shows the batches in flight.

On a small /dev/shm it fails like pytorch_fallocate.py (fallocate ENOSPC,
"Caught RuntimeError in DataLoader worker process K", exit 1); the failed
file stays until the worker's manager removes it at the end.

--kill-at K ends the run after K batches with SIGKILL (exit status 137):
  --kill job      trainer, workers and managers (docker kill, OOM of the whole
                  container): the batches in flight stay in /dev/shm for good;
  --kill trainer  only the trainer (the OOM killer's usual pick): workers
                  notice within 5 s and exit, then each manager unlinks the
                  leftovers 2 s after its last client is gone.

    python3 file_system_strategy.py --batch-bytes 256K --workers 2 [--kill-at 3 --kill job]
"""

import argparse
import os
import signal
import socket
import struct
import sys

import _dataloader as dl
from _workload import add_required_flag, print_required, human


def kill_job(loader_iter, what):
    print(f"killing the {what} with SIGKILL after receiving batches", file=sys.stderr, flush=True)
    if what == "job":
        # one cgroup-wide kill: don't let the SIGCHLD handler report a worker first
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in dl._manager_socks.values():  # the managers' pids, from the kernel
            pid, _, _ = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            os.kill(pid, signal.SIGKILL)
        for w in loader_iter.workers:
            os.kill(w.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    dl.add_loader_flags(p, batch_bytes_default=256 * 1024)
    p.add_argument("--kill-at", type=int, default=0,
                   help="SIGKILL after receiving this many batches (0: run to the end)")
    p.add_argument("--kill", choices=["job", "trainer"], default="job",
                   help="what --kill-at kills")
    add_required_flag(p)
    cfg = p.parse_args()
    cfg.alloc, cfg.errno_bug, cfg.strategy = "fallocate", "none", "file_system"
    print_required(cfg, dl.required_shm(cfg))

    for epoch in range(cfg.epochs):
        n = 0
        it = dl.DataLoaderIter(cfg, cfg.batches)
        for batch in it:
            dl.train_step(cfg, batch)
            n += 1
            if n == cfg.kill_at:
                kill_job(it, cfg.kill)
        print(f"epoch {epoch}: {n} batches of {human(cfg.batch_bytes)} "
              f"from {cfg.workers} workers", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
