#!/usr/bin/env python3
"""NCCL's SHM transport runs out of /dev/shm while ranks connect.

A torchrun-like launcher starts --ranks rank processes. Each rank, like NCCL
setting up intra-node SHM connections, creates one receive segment per
channel: mkstemp("/dev/shm/nccl-XXXXXX"), sizes it, maps it and zeroes it;
then its ring neighbour opens the path, maps it and unlinks it.

NCCL >= 2.19 (default): fallocate(fd, 0, 0, size + 4) (4 bytes of refcount
after the buffer) fails with ENOSPC, NCCL logs "Error: failed to extend
/dev/shm/nccl-XXXXXX to N bytes" (shown only with NCCL_DEBUG=WARN or INFO),
the file is left behind, and PyTorch raises DistBackendError with "Last error:
Error while creating shared memory segment ...". The rank exits 1.

--legacy, NCCL 2.12-2.18: ftruncate(fd, size) + mmap + memset: memset takes
SIGBUS inside the library, no message at all; the rank dies of signal 7.

Either way the launcher then sends SIGTERM to the other ranks, prints a
torchrun-style failure summary and exits 1. NCCL_SHM_DISABLE=1 in the
environment skips the SHM transport (the usual workaround): exit 0.

    python3 nccl_shm.py --ranks 2 --channels 2 --size 320K [--legacy]
"""

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
import traceback

from _workload import (parse_size, pages, mkstemp, fallocate, mmap_shared,
                       munmap, fill, add_required_flag, print_required)

NCCL_VERSION = {False: "2.21.5", True: "2.18.1"}


class DistBackendError(RuntimeError):
    pass


DistBackendError.__module__ = "torch.distributed"  # as printed by the traceback
_last_error = ""


def warn(rank, line, msg):
    """NCCL's WARN(): recorded as the 'last error' always, printed only with
    NCCL_DEBUG set to WARN or INFO (NCCL prints nothing by default)."""
    global _last_error
    _last_error = msg
    if os.environ.get("NCCL_DEBUG", "").upper() in ("WARN", "INFO", "TRACE"):
        print(f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()} "
              f"[{rank}] misc/shmutils.cc:{line} NCCL WARN {msg}", file=sys.stderr, flush=True)


def shm_open_create(rank, size, legacy):
    """ncclShmOpen(create): returns (path, fd, addr, mapped size)."""
    fd, path = mkstemp("/dev/shm/nccl-XXXXXX")
    if legacy:
        # 2.12-2.18 ncclShmSetup: ftruncate is sparse and never fails on tmpfs
        os.ftruncate(fd, size)
        addr = mmap_shared(fd, size)
        os.close(fd)
        fill(addr, size, 0)  # memset(ptr, 0, shmSize): SIGBUS if tmpfs is full
        return path, -1, addr, size
    real = size + 4  # sizeof(int) refcount after the buffer
    try:
        fallocate(fd, 0, real)
    except OSError as e:
        warn(rank, 76, f"Error: failed to extend {path} to {real} bytes, "
                       f"error: {e.strerror} ({e.errno})")
        warn(rank, 111, f"Error while creating shared memory segment {path} (size {size}), "
                        f"error: {e.strerror} ({e.errno})")
        # ncclShmClose on the half-made handle: close(fd) but no unlink,
        # because the refcount was never mapped: nccl-XXXXXX stays in /dev/shm
        os.close(fd)
        raise
    addr = mmap_shared(fd, real)
    ctypes.c_int.from_address(addr + size).value = 1  # one peer will attach
    fill(addr, size, 0)
    return path, fd, addr, real


def shm_attach(path, size, legacy):
    fd = os.open(path, os.O_RDWR, 0o600)
    real = size if legacy else size + 4
    addr = mmap_shared(fd, real)
    if legacy:
        os.close(fd)
        fd = -1
        os.unlink(path)  # ncclShmUnlink once the peer is connected
    else:
        ref = ctypes.c_int.from_address(addr + size)
        ref.value -= 1
        if ref.value == 0:  # the last peer to attach unlinks the file
            os.unlink(path)
    return fd, addr, real


def rank_main(rank, cfg, conn):
    version = NCCL_VERSION[cfg.legacy]
    segments = []
    if os.environ.get("NCCL_SHM_DISABLE") != "1":
        try:
            for _ in range(cfg.channels):
                segments.append(shm_open_create(rank, cfg.size, cfg.legacy))
        except OSError:
            try:  # what torch.distributed raises for ncclSystemError
                raise DistBackendError(
                    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
                    f"version {version}\nncclSystemError: System call (e.g. socket, malloc) "
                    "or external library call failed or device error. \nLast error:\n"
                    f"{_last_error}") from None
            except DistBackendError:
                traceback.print_exc()
            conn.send(None)
            sys.exit(1)
    conn.send([p for p, *_ in segments])
    prev_paths = conn.recv()  # the ring neighbour's receive segments
    attached = [shm_attach(p, cfg.size, cfg.legacy) for p in prev_paths]
    conn.send("connected")
    conn.recv()  # everyone is connected: "run the collectives"
    for fd, addr, real in attached:
        fill(addr, cfg.size, rank + 1)
    for fd, addr, real in attached + [s[1:] for s in segments]:
        munmap(addr, real)
        if fd >= 0:
            os.close(fd)
    print(f"rank {rank}: all_reduce done", flush=True)


def launcher(cfg):
    ctx = mp.get_context("fork")
    procs, conns = [], []
    for rank in range(cfg.ranks):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=rank_main, args=(rank, cfg, child))
        p.start()
        child.close()  # so a rank's death reads as EOF
        procs.append(p)
        conns.append(parent)

    def fail(rank):
        # torchrun: stop the others, then report the first failure
        for p in procs:
            if p.is_alive():
                print(f"WARNING:torch.distributed.elastic.multiprocessing.api:Sending "
                      f"process {p.pid} closing signal SIGTERM", file=sys.stderr)
                p.terminate()
        for p in procs:
            p.join()
        p = procs[rank]
        code = p.exitcode
        why = (f"Signal {-code} ({signal.Signals(-code).name}) received by PID {p.pid}"
               if code < 0 else "To enable traceback see: "
               "https://pytorch.org/docs/stable/elastic/errors.html")
        print("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
              + "=" * 60 + "\ntrain.py FAILED\n" + "-" * 60 +
              "\nRoot Cause (first observed failure):\n[0]:\n"
              f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S')}\n"
              f"  host      : {socket.gethostname()}\n"
              f"  rank      : {rank} (local_rank: {rank})\n"
              f"  exitcode  : {code} (pid: {p.pid})\n"
              f"  error_file: <N/A>\n  traceback : {why}\n" + "=" * 60,
              file=sys.stderr, flush=True)
        return 1

    def recv_all():
        out = []
        for rank, c in enumerate(conns):
            try:
                msg = c.recv()
            except EOFError:  # the rank died (SIGBUS in --legacy)
                procs[rank].join()
                return rank, None
            if msg is None:
                procs[rank].join()
                return rank, None
            out.append(msg)
        return None, out

    failed, paths = recv_all()
    if failed is not None:
        return fail(failed)
    for rank, c in enumerate(conns):
        c.send(paths[(rank - 1) % cfg.ranks] if cfg.ranks > 1 else [])
    failed, _ = recv_all()
    if failed is not None:
        return fail(failed)
    for c in conns:
        c.send("go")
    for rank, p in enumerate(procs):
        p.join()
        if p.exitcode != 0:
            return fail(rank)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="local ranks (GPUs) on the node")
    p.add_argument("--channels", type=int, default=2,
                   help="SHM receive segments each rank creates")
    p.add_argument("--size", type=parse_size, default=320 * 1024,
                   help="bytes per segment (real NCCL: about 9637888 with default buffers)")
    p.add_argument("--legacy", action="store_true",
                   help="NCCL 2.12-2.18: ftruncate + mmap + memset, SIGBUS instead of ENOSPC")
    add_required_flag(p)
    cfg = p.parse_args()
    print_required(cfg, cfg.ranks * cfg.channels * pages(cfg.size + (0 if cfg.legacy else 4)))
    return launcher(cfg)


if __name__ == "__main__":
    sys.exit(main())
