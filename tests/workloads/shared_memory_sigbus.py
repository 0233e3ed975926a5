#!/usr/bin/env python3
"""multiprocessing.shared_memory: the writer dies of SIGBUS on a full /dev/shm.

SharedMemory(create=True, size=N) is shm_open("/psm_xxxxxxxx") + ftruncate +
mmap: ftruncate only sets the file size, so nothing fails until the data is
written. When tmpfs runs out of pages, the store into the mapping faults with
SIGBUS (BUS_ADRERR). CPython installs no SIGBUS handler: the writing process
is killed by signal 7, with no Python traceback.

--workers 0 (default): the creator writes the buffer itself and dies; the shell
sees status 135 (128 + 7). multiprocessing's resource_tracker process then
warns about the leaked segment and unlinks it.
--workers N: N child processes attach by name and each write a slice, like a
parallel producer filling a shared array; a faulting child has
Process.exitcode -7; the parent raises RuntimeError naming it, unlinks the
segment and exits 1.

    python3 shared_memory_sigbus.py --size 2M [--workers 2]
"""

import argparse
import multiprocessing as mp
import sys
from multiprocessing import shared_memory

from _workload import parse_size, pages, human, add_required_flag, print_required


def write_slice(name, start, stop):
    shm = shared_memory.SharedMemory(name=name)  # shm_open O_RDWR, fstat, mmap
    shm.buf[start:stop] = b"\x01" * (stop - start)
    shm.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=2 * 1024 * 1024,
                   help="SharedMemory size; the whole of it gets written")
    p.add_argument("--workers", type=int, default=0,
                   help="child processes that write the buffer (0: the creator writes)")
    add_required_flag(p)
    args = p.parse_args()
    print_required(args, pages(args.size))

    shm = shared_memory.SharedMemory(create=True, size=args.size)
    print(f"created /dev/shm/{shm.name} ({human(args.size)})", flush=True)
    try:
        if args.workers == 0:
            shm.buf[:] = b"\x01" * args.size  # SIGBUS here when tmpfs is full
        else:
            ctx = mp.get_context("fork")
            step = -(-args.size // args.workers)
            procs = [ctx.Process(target=write_slice,
                                 args=(shm.name, i * step, min(args.size, (i + 1) * step)))
                     for i in range(args.workers)]
            for w in procs:
                w.start()
            for w in procs:
                w.join()
            for i, w in enumerate(procs):
                if w.exitcode != 0:
                    raise RuntimeError(f"writer {i} (pid {w.pid}) exited with code {w.exitcode}")
        print(f"wrote {human(args.size)} into /dev/shm/{shm.name}", flush=True)
    finally:
        shm.close()
        shm.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
