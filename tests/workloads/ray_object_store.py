#!/usr/bin/env python3
"""A real Ray (from PyPI) starting a local cluster with an object store of STORE bytes.

Ray looks at /dev/shm's free space before it places its object store, and no call
fails whatever it decides: with room, the store is a file in /dev/shm; without,
the driver puts it in /tmp (slower, with a warning), or refuses with ValueError
when the store is over 10 GB; and the raylet shrinks a store bigger than 90% of
its directory's free space. Writes where the store went, as the raylet was told
(`--plasma_directory`) and as it logged, to --report; exits 0 unless Ray raised.
Needs the venv of tests/src/ray.rs.

    /opt/shmtrace-ray-venv/bin/python ray_object_store.py 200M --report /work/store
"""

import argparse
import glob
import os
import time

import ray

from _workload import parse_size

SHRUNK = "System memory request exceeds memory available"


def raylet_flag(name):
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == "raylet":
            for arg in argv:
                if arg.startswith(name + "="):
                    return arg.split("=", 1)[1]
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("store", type=parse_size)
    parser.add_argument("--report", required=True)
    parser.add_argument(
        "--after",
        help="start the cluster only once this file exists (and say so by making FILE.waiting): "
        "a driver that runs before a tracer starts",
    )
    args = parser.parse_args()
    if args.after:
        open(args.after + ".waiting", "w").close()
        while not os.path.exists(args.after):
            time.sleep(0.05)
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=args.store)
    data = b"x" * (1 << 20)
    assert ray.get(ray.put(data)) == data
    directory = raylet_flag("--plasma_directory")
    logs = glob.glob("/tmp/ray/session_latest/logs/raylet.out")
    shrunk = any(SHRUNK in open(log, errors="replace").read() for log in logs)
    ray.shutdown()
    with open(args.report, "w") as f:
        f.write(f"directory={directory} shrunk={int(shrunk)}\n")


if __name__ == "__main__":
    main()
