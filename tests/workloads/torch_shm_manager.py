#!/usr/bin/env python3
"""Stand-in for PyTorch's torch_shm_manager daemon (libshm), used by the
`file_system` sharing strategy in file_system_strategy.py; not a workload.

Started (fork+exec) by the first process that creates a file_system storage.
It names itself torch_shm_manager (the kernel keeps 15 characters:
`torch_shm_manag`, the comm of the real exec'd binary), leaves the caller's
session, listens on /tmp/torch-shm-dir-XXXXXX/manager.sock and prints that
path on stdout. Clients register each /dev/shm name they create or attach
("REG /torch_...") and report names they freed ("FREE /torch_..."). Two
seconds after its last client disconnects it shm_unlink()s every name still
registered -- the leftovers of crashed processes -- and exits. Killed with
SIGKILL, it cleans up nothing.
"""

import os
import selectors
import shutil
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workload import set_comm  # noqa: E402

SHUTDOWN_TIMEOUT = 2.0


def main():
    set_comm("torch_shm_manager")
    os.setsid()
    tmpdir = tempfile.mkdtemp(prefix="torch-shm-dir-")
    path = os.path.join(tmpdir, "manager.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    print(path, flush=True)
    os.close(1)  # the creator reads one line; don't hold its pipe open

    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    clients, used = {}, set()
    while True:
        events = sel.select(timeout=None if clients else SHUTDOWN_TIMEOUT)
        if not events and not clients:
            break
        for key, _ in events:
            if key.fileobj is srv:
                conn, _ = srv.accept()
                clients[conn] = b""
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            data = conn.recv(65536)
            if not data:
                sel.unregister(conn)
                conn.close()
                del clients[conn]
                continue
            buf = clients[conn] + data
            *lines, clients[conn] = buf.split(b"\n")
            for line in lines:
                op, name = line.decode().split(" ", 1)
                if op == "REG":
                    used.add(name)
                else:
                    used.discard(name)
    for name in sorted(used):
        try:
            os.unlink("/dev/shm" + name)  # shm_unlink()
        except FileNotFoundError:
            pass
    srv.close()
    shutil.rmtree(tmpdir, ignore_errors=True)


if __name__ == "__main__":
    main()
