#!/usr/bin/env python3
"""System V shared memory refused by the IPC limits, not by /dev/shm.

A server (PostgreSQL before 9.3 is the classic one) creates --segments
segments of --size bytes with shmget(key, size, IPC_CREAT|IPC_EXCL|0600),
attaches them with shmat, touches every page, then detaches and removes them.
SysV segments live in the IPC namespace's own internal tmpfs, outside
/dev/shm; what refuses them are the namespace's sysctls:

- size > kernel.shmmax               -> shmget EINVAL
- total pages > kernel.shmall        -> shmget ENOSPC
- segments > kernel.shmmni           -> shmget ENOSPC

The error is printed the way PostgreSQL prints it and the exit status is 1.
Docker gives each container its own IPC namespace (`--ipc=private`/
`shareable`) whose limits can be set with `--sysctl kernel.shmmax=...`; by hand:
`unshare -i sh -c 'echo 1048576 > /proc/sys/kernel/shmmax; python3 sysv_shm.py'`.

    python3 sysv_shm.py --segments 2 --size 2M
"""

import argparse
import ctypes
import os
import sys

from _workload import libc, parse_size, pages, human

IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]

HINT = {
    "EINVAL": "This error usually means that the request for a shared memory segment "
              "exceeded your kernel's SHMMAX parameter, or possibly that it is less than "
              "your kernel's SHMMIN parameter.",
    "ENOSPC": "This error does *not* mean that you have run out of disk space. It occurs "
              "either if all available shared memory IDs have been taken, in which case you "
              "need to raise the SHMMNI parameter in your kernel, or because the system's "
              "overall limit for shared memory has been reached (SHMALL).",
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--size", type=parse_size, default=2 * 1024 * 1024)
    p.add_argument("--key", type=int, default=5432001, help="key of the first segment")
    p.add_argument("--required-limits", action="store_true",
                   help="print the kernel.shmmax, shmall (pages) and shmmni this needs, and exit")
    args = p.parse_args()
    if args.required_limits:
        print(f"kernel.shmmax={args.size} kernel.shmall="
              f"{args.segments * pages(args.size) // pages(1)} kernel.shmmni={args.segments}")
        return 0

    flags = IPC_CREAT | IPC_EXCL | 0o600
    made = []
    try:
        for i in range(args.segments):
            key = args.key + i
            shmid = libc.shmget(key, args.size, flags)
            if shmid < 0:
                err = ctypes.get_errno()
                name = {22: "EINVAL", 28: "ENOSPC"}.get(err, "")
                print(f"FATAL:  could not create shared memory segment: {os.strerror(err)}\n"
                      f"DETAIL:  Failed system call was shmget(key={key}, size={args.size}, "
                      f"0{flags:o}).", file=sys.stderr)
                if name:
                    print(f"HINT:  {HINT[name]}", file=sys.stderr)
                return 1
            addr = libc.shmat(shmid, None, 0)
            made.append((shmid, addr))
            ctypes.memset(addr, 0, args.size)
        print(f"created {args.segments} System V segments of {human(args.size)}", flush=True)
        return 0
    finally:
        for shmid, addr in made:
            libc.shmdt(addr)
            libc.shmctl(shmid, IPC_RMID, None)


if __name__ == "__main__":
    sys.exit(main())
