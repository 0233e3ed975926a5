#!/usr/bin/env python3
"""Several processes that ask /dev/shm for memory at the same moment.

--procs N processes start together, wait at a barrier, then each creates
/dev/shm/shmtrace-burst-<pid>, ftruncates it and posix_fallocates it to --size
(as PostgreSQL's parallel workers size their segments), holds it for --hold
seconds and removes it. On a small /dev/shm several of them get ENOSPC within
a millisecond of each other; each prints the error and exits 1, and so does
the parent. Exit 0 when everything fitted.

    python3 burst.py --procs 5 --size 6M
"""

import argparse
import multiprocessing as mp
import os
import sys
import time

from _workload import parse_size, human


def worker(barrier, size, hold):
    path = f"/dev/shm/shmtrace-burst-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        barrier.wait()
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            print(f"pid {os.getpid()}: could not resize shared memory segment "
                  f"{path} to {size} bytes: {e.strerror}", file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(hold)
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--size", type=parse_size, default=6 << 20, help="bytes per process")
    p.add_argument("--hold", type=float, default=0.5)
    args = p.parse_args()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.procs)
    procs = [ctx.Process(target=worker, args=(barrier, args.size, args.hold))
             for _ in range(args.procs)]
    for w in procs:
        w.start()
    for w in procs:
        w.join()
    failed = [w.pid for w in procs if w.exitcode != 0]
    if failed:
        print(f"{len(failed)} of {args.procs} processes failed: {failed}", file=sys.stderr)
        sys.exit(1)
    print(f"{args.procs} x {human(args.size)} fitted")


if __name__ == "__main__":
    main()
