#!/usr/bin/env python3
"""A service that looks at /dev/shm's free space when it starts (statvfs, as vLLM and other
servers do before they size their buffers), then serves until it is stopped: SIGINT (Ctrl-C)
or SIGTERM (docker stop) ends it with 128 + the signal's number, as a shell reports it.

    python3 look_then_serve.py --ready /tmp/ready
"""

import argparse
import shutil
import signal
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ready", required=True, help="created once it serves")
    args = p.parse_args()
    usage = shutil.disk_usage("/dev/shm")
    print(f"/dev/shm: {usage.free} of {usage.total} bytes free", flush=True)

    def stop(signo, _frame):
        print(f"stopped by signal {signo}", file=sys.stderr, flush=True)
        sys.exit(128 + signo)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    open(args.ready, "w").close()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
