#!/usr/bin/env python3
"""multiprocessing locks and queues fail on a full /dev/shm: sem_open ENOSPC.

Every multiprocessing Lock, Semaphore, Event, Condition and Queue is a POSIX
named semaphore. glibc's sem_open creates it as a file: openat
"/dev/shm/sem.XXXXXX" (O_RDWR|O_CREAT|O_EXCL), write() the 32-byte sem_t, mmap,
link() to "sem.mp-xxxxxxxx", unlink the temporary name. The 32-byte write needs
one tmpfs page; on a full /dev/shm it fails with ENOSPC, glibc unlinks the
temporary file, and Python raises "OSError: [Errno 28] No space left on device"
from multiprocessing/synchronize.py. Exit status 1.

First a short-lived filler process (comm `shm_filler`) writes
/dev/shm/filler-<pid> (--fill-bytes, default: until ENOSPC), standing for
whatever else filled /dev/shm (leftovers, another job); it exits and leaves the
file. Then the program sets up --queues multiprocessing queues (3 semaphores
each) and passes a message to a child process through them.

    python3 semaphore_enospc.py [--fill-bytes 1M] [--queues 2]
"""

import argparse
import errno
import multiprocessing as mp
import os
import sys

from _workload import parse_size, pages, human, set_comm, add_required_flag, print_required


def filler(path, nbytes):
    """Write up to nbytes into path, stop quietly at ENOSPC, leave the file."""
    set_comm("shm_filler")
    chunk = b"\xff" * 65536
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while nbytes is None or written < nbytes:
            want = chunk if nbytes is None else chunk[:nbytes - written]
            try:
                written += os.write(fd, want)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    print(f"shm_filler: wrote {human(written)} to {path}", flush=True)


def echo(inq, outq):
    outq.put(inq.get())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fill-bytes", type=parse_size, default=None,
                   help="bytes the filler writes first (default: until /dev/shm is full)")
    p.add_argument("--queues", type=int, default=2,
                   help="multiprocessing.Queue objects to create (3 semaphores each)")
    p.add_argument("--keep-fill", action="store_true",
                   help="leave the filler file in /dev/shm at exit")
    add_required_flag(p)
    args = p.parse_args()
    if args.required_shm and args.fill_bytes is None:
        p.error("--required-shm needs --fill-bytes (filling until full has no size)")
    print_required(args, pages(args.fill_bytes or 0) + 3 * args.queues * pages(1))

    ctx = mp.get_context("fork")
    path = f"/dev/shm/filler-{os.getpid()}"
    f = ctx.Process(target=filler, args=(path, args.fill_bytes))
    f.start()
    f.join()
    try:
        queues = [ctx.Queue() for _ in range(args.queues)]  # OSError ENOSPC here
        if len(queues) >= 2:
            child = ctx.Process(target=echo, args=(queues[0], queues[1]))
            child.start()
            queues[0].put("ping")
            print(f"child answered: {queues[1].get()}", flush=True)
            child.join()
        print(f"{args.queues} queues working", flush=True)
    finally:
        if not args.keep_fill:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
