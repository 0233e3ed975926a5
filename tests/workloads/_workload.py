"""Helpers shared by the /dev/shm workload scripts (stdlib only).

The scripts must make the same system calls as the real programs they stand in
for, so the few calls Python would otherwise wrap differently go through libc
with ctypes: mmap (Python's mmap module dup()s the fd and fstat()s first),
prctl(PR_SET_NAME), mkstemp, fallocate and a SA_SIGINFO signal handler.
"""

import argparse
import ctypes
import mmap as _mmap
import os
import re
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")

libc = ctypes.CDLL(None, use_errno=True)

libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                      ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_ulong, ctypes.c_ulong]
libc.mkstemp.argtypes = [ctypes.c_char_p]
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]

MAP_FAILED = ctypes.c_void_p(-1).value
PR_SET_NAME = 15


def parse_size(text):
    """'96M', '96MiB', '1g', '4096' -> bytes (binary units: K = 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower())


def pages(nbytes):
    """Bytes a tmpfs charges for a file of nbytes: whole pages."""
    return -(-nbytes // PAGE) * PAGE


def human(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def set_comm(name):
    """prctl(PR_SET_NAME): what torch.multiprocessing._set_thread_name does
    (via pthread_setname_np on the calling thread). Sets the calling thread's
    comm; called from the main thread it renames the thread-group leader."""
    if libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def mmap_shared(fd, size):
    """mmap(NULL, size, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0) -> address."""
    addr = libc.mmap(None, size, _mmap.PROT_READ | _mmap.PROT_WRITE, _mmap.MAP_SHARED, fd, 0)
    if addr == MAP_FAILED or addr is None:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return addr


def munmap(addr, size):
    libc.munmap(addr, size)


def fill(addr, size, byte=0x5A):
    """Touch every page of a mapping. On a full tmpfs this is where SIGBUS
    (BUS_ADRERR) is raised, inside memset, as in PyTorch's collate or NCCL."""
    ctypes.memset(addr, byte, size)


def mkstemp(template):
    """glibc mkstemp: openat(..., O_RDWR|O_CREAT|O_EXCL, 0600) with 6 random
    characters, which is what NCCL calls (Python's tempfile differs)."""
    buf = ctypes.create_string_buffer(template.encode())
    fd = libc.mkstemp(buf)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), buf.value.decode())
    return fd, buf.value.decode()


def fallocate(fd, offset, length):
    """fallocate(2) with mode 0, errno on failure (NCCL calls it directly)."""
    if libc.fallocate(fd, 0, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# --- a PyTorch-style worker SIGBUS handler -----------------------------------

SIGBUS_MESSAGE = (b"ERROR: Unexpected bus error encountered in worker. "
                  b"This might be caused by insufficient shared memory (shm).\n")


class _Sigaction(ctypes.Structure):
    # glibc x86_64 struct sigaction
    _fields_ = [("sa_handler", ctypes.c_void_p),
                ("sa_mask", ctypes.c_ulong * 16),
                ("sa_flags", ctypes.c_int),
                ("sa_restorer", ctypes.c_void_p)]


SA_NOCLDSTOP, SA_SIGINFO, SA_RESTART, SA_NODEFER = 0x1, 0x4, 0x10000000, 0x40000000
_HANDLER_T = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_handlers = []  # keep the ctypes thunks alive


def _sigbus_handler(sig, info, ctx):
    # torch/csrc/DataLoader.cpp: write(2, MSG, sizeof(MSG)) -- sizeof counts the
    # terminating NUL, so a '\0' byte really follows the newline on stderr --
    # then reset to SIG_DFL and raise(): a second SIGBUS, by tgkill, kills us.
    os.write(2, SIGBUS_MESSAGE + b"\0")
    dfl = _Sigaction()  # SIG_DFL, empty mask, flags 0
    if libc.sigaction(sig, ctypes.byref(dfl), None) != 0:
        os._exit(1)
    getattr(libc, "raise")(sig)


def set_worker_signal_handlers():
    """torch._C._set_worker_signal_handlers() for SIGBUS. The handler must be a
    real sigaction handler: a Python signal.signal() handler only sets a flag
    and returns, so the faulting store would fault again forever."""
    thunk = _HANDLER_T(_sigbus_handler)
    _handlers.append(thunk)
    sa = _Sigaction()
    sa.sa_handler = ctypes.cast(thunk, ctypes.c_void_p).value
    sa.sa_flags = SA_RESTART | SA_SIGINFO | SA_NOCLDSTOP | SA_NODEFER
    import signal
    if libc.sigaction(signal.SIGBUS, ctypes.byref(sa), None) != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGBUS)")


def print_required(args, required):
    """--required-shm: print the /dev/shm bytes this invocation needs, and exit."""
    if getattr(args, "required_shm", False):
        print(required)
        sys.exit(0)


def add_required_flag(parser):
    parser.add_argument(
        "--required-shm", action="store_true",
        help="print the /dev/shm size in bytes this invocation needs to succeed "
             "(see README.md for the formula) and exit")
