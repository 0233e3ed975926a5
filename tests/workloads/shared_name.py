#!/usr/bin/env python3
"""Python's multiprocessing.shared_memory by name, as a job's processes share a buffer:
an owner creates /dev/shm/<name> (8 MiB) and holds it mapped; after --wait seconds a
reader attaches by name with SharedMemory(name=...). When something removed the name in
between (a clean-up script, `rm`), the attach fails with FileNotFoundError and this exits 2.

    python3 shared_name.py --name job_buf --wait 1 [--remove-with-rm]
    python3 shared_name.py --attach-after /sync/removed   (when a clean-up elsewhere is done)
"""

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time
from multiprocessing import shared_memory


def owner(name, size, ready, done):
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    shm.buf[:size] = bytes(size)
    ready.set()
    done.wait()
    shm.close()
    shm.unlink()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", default="job_buf")
    p.add_argument("--size", type=int, default=8 << 20)
    p.add_argument("--wait", type=float, default=1.0)
    p.add_argument("--remove-with-rm", action="store_true",
                   help="another process of the job removes the name while the owner holds it")
    p.add_argument("--attach-after", metavar="FILE",
                   help="attach once FILE exists (up to a minute) instead of after --wait")
    args = p.parse_args()
    ready, done = mp.Event(), mp.Event()
    held = mp.Process(target=owner, args=(args.name, args.size, ready, done))
    held.start()
    ready.wait()
    if args.remove_with_rm:
        subprocess.run(["rm", "-f", f"/dev/shm/{args.name}"], check=True)
    if args.attach_after:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.attach_after) and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        time.sleep(args.wait)
    try:
        shm = shared_memory.SharedMemory(name=args.name)
    except FileNotFoundError as e:
        print(f"reader: {e}", file=sys.stderr)
        done.set()
        held.join()
        sys.exit(2)
    total = sum(shm.buf[:4096])
    shm.close()
    done.set()
    held.join()
    print(f"reader attached to /dev/shm/{args.name}: {args.size} bytes, checksum {total}")


if __name__ == "__main__":
    main()
