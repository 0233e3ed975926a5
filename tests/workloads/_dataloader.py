"""A miniature torch.utils.data.DataLoader (multi-process; sharing strategy
`file_descriptor`, the Linux default, or `file_system`), close enough to the
real one that the kernel sees the same calls: the same /dev/shm objects,
sizes, fd passing, thread names, signals and exits. Only stdlib; no PyTorch.

What it keeps from PyTorch, and why it matters to shmtrace:
- workers are multiprocessing processes (fork, or forkserver: then they are
  children of the forkserver, not of the trainer) renamed `pt_data_worker`;
- each batch is collated straight into /dev/shm storage made by a copy of
  ATen's MapAllocator (`new_shared`), in one of two versions:
  `fallocate` (PyTorch >= 2.10) or `write` (<= 2.9: no fallocate, so a full
  tmpfs turns into SIGBUS when the mapping is written);
- storages travel to the trainer as file descriptors: torch's reduce_storage
  pickles `multiprocessing.reduction.DupFd(fd)`, so each one crosses a fresh
  AF_UNIX connection to the worker's resource_sharer thread with SCM_RIGHTS;
  the trainer (or its `pt_data_pin` thread) dup()s and mmap()s it;
- prefetch: prefetch_factor x num_workers batch indices are outstanding;
- errors: a worker exception is wrapped and re-raised by the trainer as
  "Caught X in DataLoader worker process K."; a SIGCHLD handler reports
  workers killed by a signal; a dead worker found after a 5 s queue timeout is
  "exited unexpectedly"; EMFILE gets PyTorch's "Too many open files" message.
"""

import atexit
import errno
import itertools
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import ctypes
import multiprocessing as mp
from multiprocessing.reduction import ForkingPickler, DupFd

from _workload import (set_comm, mmap_shared, munmap, fill, pages,
                       set_worker_signal_handlers)

MP_STATUS_CHECK_INTERVAL = 5.0  # torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL

# --------------------------------------------------------------------------
# Storage in /dev/shm: ATen MapAllocator with
# ALLOCATOR_MAPPED_SHAREDMEM | EXCLUSIVE | KEEPFD | UNLINK (creator side)
# and FROMFD | KEEPFD (receiver side).
# --------------------------------------------------------------------------

_handle_counter = itertools.count()


class SharedStorage:
    """A tensor storage mapped from a /dev/shm file; holds its fd (KEEPFD)."""

    def __init__(self, fd, addr, size):
        self.fd, self.addr, self.size = fd, addr, size

    def close(self):
        # MapAllocator::close(): close(fd) then munmap
        if self.addr is not None:
            os.close(self.fd)
            munmap(self.addr, self.size)
            self.addr = None

    __del__ = close


def _map_allocator(name, size, alloc, errno_bug):
    """The creating half of ATen's MapAllocator for a new shared-memory file:
    shm_open(O_CREAT|O_EXCL) -> ftruncate -> [fallocate] -> write 1 byte -> mmap.

    alloc: "fallocate" = PyTorch >= 2.10, "write" = PyTorch <= 2.9.
    errno_bug: PyTorch 2.10/2.11 read errno instead of posix_fallocate's return
    value: "stale" prints a stale errno (EAGAIN), "ignored" carries on as if
    fallocate were unsupported, so the shortage shows up later as SIGBUS.
    Returns (fd, addr).
    """
    path = "/dev/shm" + name
    # shm_open() adds O_NOFOLLOW|O_CLOEXEC to PyTorch's O_RDWR|O_CREAT|O_EXCL
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        raise RuntimeError(f"unable to open shared memory object <{name}> in "
                           f"read-write mode: {e.strerror} ({e.errno})") from None
    os.fstat(fd)
    try:
        os.ftruncate(fd, size)
    except OSError as e:  # the real code leaks fd and file here too
        raise RuntimeError(f"unable to resize file <{name}> to the right size: "
                           f"{e.strerror} ({e.errno})") from None
    if alloc == "fallocate":
        try:
            os.posix_fallocate(fd, 0, size)  # glibc -> fallocate(fd, 0, 0, size)
        except OSError as e:
            if errno_bug == "ignored" or e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                pass
            else:
                err = errno.EAGAIN if errno_bug == "stale" else e.errno
                # TORCH_CHECK throws without close() or shm_unlink(): the fd
                # stays open in this worker and the (empty) file stays in /dev/shm.
                raise RuntimeError(
                    f"unable to allocate shared memory(shm) for file <{name}>: "
                    f"{os.strerror(err)} ({err})") from None
    os.fstat(fd)
    try:
        os.write(fd, b"\0")  # write(fd, "", 1) at offset 0: allocates one page
    except OSError as e:
        os.close(fd)
        raise RuntimeError(f"unable to write to file <{name}>: "
                           f"{e.strerror} ({e.errno})") from None
    try:
        addr = mmap_shared(fd, size)
    except OSError as e:
        raise RuntimeError(f"unable to mmap {size} bytes from file <{name}>: "
                           f"{e.strerror} ({e.errno})") from None
    os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
    return fd, addr


def _new_handle():
    """at::NewProcessWideShmHandle()"""
    return f"/torch_{os.getpid()}_{random.getrandbits(32)}_{next(_handle_counter)}"


def new_shared(size, alloc="fallocate", errno_bug="none", strategy="file_descriptor"):
    """storage._new_shared(size) in a DataLoader worker."""
    if strategy == "file_system":
        return FilenameStorage.create(size, alloc, errno_bug)
    # MapAllocator(handle, SHAREDMEM|EXCLUSIVE|KEEPFD|UNLINK, size)
    name = _new_handle()
    fd, addr = _map_allocator(name, size, alloc, errno_bug)
    os.unlink("/dev/shm" + name)  # shm_unlink(): gone from `ls /dev/shm`, pages still used
    return SharedStorage(fd, addr, size)


def rebuild_storage_fd(df, size):
    """torch.multiprocessing.reductions.rebuild_storage_fd + _new_shared_fd_cpu."""
    fd = df.detach()  # connect to the sender's resource_sharer, recvmsg SCM_RIGHTS
    try:
        os.fstat(fd)  # fd_id(fd), the shared-storage cache key
        newfd = os.dup(fd)
        os.fstat(newfd)
        try:
            addr = mmap_shared(newfd, size)
        except OSError as e:  # ENOMEM here is vm.max_map_count, not /dev/shm
            os.close(newfd)
            raise RuntimeError(f"unable to mmap {size} bytes from file <filename not "
                               f"specified>: {e.strerror} ({e.errno})") from None
        os.posix_fadvise(newfd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        return SharedStorage(newfd, addr, size)
    finally:
        os.close(fd)


def reduce_storage(storage):
    os.fstat(storage.fd)  # fd_id(fd)
    return (rebuild_storage_fd, (DupFd(storage.fd), storage.size))


ForkingPickler.register(SharedStorage, reduce_storage)


# --------------------------------------------------------------------------
# Sharing strategy `file_system`: libshm's THManagedMapAllocator around a
# RefcountedMapAllocator. The file keeps its name in /dev/shm while in use
# (it travels by name, not by fd) and is unlinked by whoever drops the last
# reference; a torch_shm_manager daemon per creating process unlinks what is
# left when all its clients are gone -- unless it is killed too.
# --------------------------------------------------------------------------

MAP_ALLOC_ALIGNMENT = 64  # the refcount header in front of the data
_MANAGER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_shm_manager.py")
_own_manager = None      # socket path of the manager this process started
_manager_socks = {}      # socket path -> connected client socket


def _manager_socket(handle):
    sock = _manager_socks.get(handle)
    if sock is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(handle)
        _manager_socks[handle] = sock
    return sock


def _start_manager():
    """libshm start_manager(): fork+exec torch_shm_manager, read its socket path."""
    global _own_manager
    if _own_manager is None:
        p = subprocess.Popen([sys.executable, _MANAGER], stdout=subprocess.PIPE)
        _own_manager = p.stdout.readline().decode().strip()
        p.stdout.close()
    return _own_manager


class FilenameStorage:
    def __init__(self, manager, name, size, base):
        self.manager, self.name, self.size, self.base = manager, name, size, base
        self.addr = base + MAP_ALLOC_ALIGNMENT  # the data follows the refcount
        self.sent = False

    @classmethod
    def create(cls, size, alloc, errno_bug):
        manager = _start_manager()
        name = _new_handle()
        # THManagedMapAllocatorInit registers the name before the file exists
        _manager_socket(manager).sendall(f"REG {name}\n".encode())
        fd, addr = _map_allocator(name, size + MAP_ALLOC_ALIGNMENT, alloc, errno_bug)
        os.close(fd)  # no KEEPFD: the name is the handle
        ctypes.c_int.from_address(addr).value = 1  # refcount
        return cls(manager, name, size, addr)

    @classmethod
    def attach(cls, manager, name, size):
        """_new_shared_filename_cpu: shm_open(O_RDWR) an existing object by name."""
        _manager_socket(manager).sendall(f"REG {name}\n".encode())
        fd = os.open("/dev/shm" + name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.fstat(fd)
        addr = mmap_shared(fd, size + MAP_ALLOC_ALIGNMENT)
        os.posix_fadvise(fd, 0, size + MAP_ALLOC_ALIGNMENT, os.POSIX_FADV_SEQUENTIAL)
        os.close(fd)
        return cls(manager, name, size, addr)

    def close(self):
        if self.addr is None:
            return
        # The sender's _shared_incref() when pickling and the receiver's
        # incref/decref pair cancel out: a sent storage is released by the
        # receiver, which takes the count to 0 and unlinks. (Real PyTorch
        # updates the count atomically; here only one side writes it.)
        if not self.sent:
            ctypes.c_int.from_address(self.base).value = 0
            os.unlink("/dev/shm" + self.name)
            try:
                _manager_socket(self.manager).sendall(f"FREE {self.name}\n".encode())
            except OSError:
                pass
        munmap(self.base, self.size + MAP_ALLOC_ALIGNMENT)
        self.addr = None

    __del__ = close


def rebuild_storage_filename(manager, name, size):
    return FilenameStorage.attach(manager, name, size)


def reduce_filename_storage(storage):
    storage.sent = True  # storage._shared_incref()
    return (rebuild_storage_filename, (storage.manager, storage.name, storage.size))


ForkingPickler.register(FilenameStorage, reduce_filename_storage)


class PinnedStorage:
    """A batch copied out of /dev/shm into ordinary ("pinned") memory."""

    def __init__(self, storage):
        self.size = storage.size
        self.buf = ctypes.create_string_buffer(storage.size)
        ctypes.memmove(self.buf, storage.addr, storage.size)
        self.addr = ctypes.addressof(self.buf)


# --------------------------------------------------------------------------
# Errors carried from workers (torch._utils.ExceptionWrapper)
# --------------------------------------------------------------------------

class ExceptionWrapper:
    def __init__(self, where):
        exc_info = sys.exc_info()
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        raise self.exc_type(msg)


# --------------------------------------------------------------------------
# Worker process (torch.utils.data._utils.worker._worker_loop)
# --------------------------------------------------------------------------

def collate(cfg, index):
    """default_collate in a worker: the output tensors are created directly in
    shared memory (storage._new_shared) and the samples are written into them."""
    if cfg.load_ms:
        time.sleep(cfg.load_ms / 1000)
    per_tensor = cfg.batch_bytes // cfg.tensors_per_batch
    batch = []
    for _ in range(cfg.tensors_per_batch):
        t = new_shared(per_tensor, cfg.alloc, cfg.errno_bug,
                       getattr(cfg, "strategy", "file_descriptor"))
        fill(t.addr, t.size, index & 0xFF)
        batch.append(t)
    return batch


def _worker_loop(cfg, index_queue, data_queue, done_event, worker_id):
    if cfg.rename:  # PyTorch >= 2.5
        set_comm("pt_data_worker")
    set_worker_signal_handlers()
    # PyTorch's worker SIGTERM handler exits 0 when the trainer terminates it
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    parent = os.getppid()  # ManagerWatchdog
    while True:
        try:
            r = index_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
        except queue.Empty:
            if os.getppid() != parent:
                break
            continue
        if r is None:
            break
        if done_event.is_set():
            continue
        idx, index = r
        try:
            data = collate(cfg, index)
        except Exception:
            data = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        data_queue.put((idx, data))
        del data, idx, index, r
    if done_event.is_set():
        data_queue.cancel_join_thread()
        data_queue.close()


# --------------------------------------------------------------------------
# Pin-memory thread (torch.utils.data._utils.pin_memory._pin_memory_loop)
# --------------------------------------------------------------------------

def _pin_memory_loop(in_queue, out_queue, done_event):
    set_comm("pt_data_pin")  # names this thread only, not the trainer
    while not done_event.is_set():
        try:
            r = in_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
        except queue.Empty:
            continue
        idx, data = r
        if not done_event.is_set() and not isinstance(data, ExceptionWrapper):
            data = [PinnedStorage(t) for t in data]  # the shm storage is dropped here
        while not done_event.is_set():
            try:
                out_queue.put((idx, data), timeout=MP_STATUS_CHECK_INTERVAL)
                break
            except queue.Full:
                continue
        del r, idx, data


# --------------------------------------------------------------------------
# SIGCHLD handling in the trainer (torch/csrc/DataLoader.cpp)
# --------------------------------------------------------------------------

_worker_pids = {}


def _error_if_any_worker_fails():
    for key, pids in _worker_pids.items():
        for pid in list(pids):
            try:
                # WNOWAIT: leave the status for multiprocessing to reap
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # not our child (forkserver): skip
                continue
            if info is None or info.si_pid == 0:
                continue
            if info.si_code == os.CLD_EXITED and info.si_status != 0:
                pids.clear()
                raise RuntimeError(
                    f"DataLoader worker (pid {pid}) exited unexpectedly with exit code "
                    f"{info.si_status}. Details are lost due to multiprocessing. "
                    "Rerunning with num_workers=0 may give better error trace.")
            if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                msg = (f"DataLoader worker (pid {pid}) is killed by signal: "
                       f"{signal.strsignal(info.si_status)}. ")
                if info.si_status == signal.SIGBUS:
                    msg += ("It is possible that dataloader's workers are out of shared "
                            "memory. Please try to raise your shared memory limit.")
                pids.clear()
                raise RuntimeError(msg)


_sigchld_set = False


def _set_sigchld_handler():
    global _sigchld_set
    if _sigchld_set:
        return
    previous = signal.getsignal(signal.SIGCHLD)
    previous = previous if callable(previous) else None

    def handler(signum, frame):
        _error_if_any_worker_fails()
        if previous is not None:
            previous(signum, frame)

    signal.signal(signal.SIGCHLD, handler)
    _sigchld_set = True


# --------------------------------------------------------------------------
# The trainer side (_MultiProcessingDataLoaderIter)
# --------------------------------------------------------------------------

_live_iters = []


@atexit.register
def _shutdown_live_iters():
    # Registered after multiprocessing's own exit hook, so it runs first: shut
    # workers down cleanly instead of letting multiprocessing SIGTERM them.
    for it in list(_live_iters):
        it._shutdown_workers()


class DataLoaderIter:
    def __init__(self, cfg, num_batches):
        self.cfg = cfg
        ctx = mp.get_context(cfg.start_method)
        self.num_batches = num_batches
        self.worker_result_queue = ctx.Queue()
        self.done_event = ctx.Event()
        self.index_queues, self.workers, self.workers_status = [], [], []
        for i in range(cfg.workers):
            iq = ctx.Queue()
            iq.cancel_join_thread()
            w = ctx.Process(target=_worker_loop, daemon=True,
                            args=(cfg, iq, self.worker_result_queue, self.done_event, i))
            w.start()
            self.index_queues.append(iq)
            self.workers.append(w)
            self.workers_status.append(True)
        self.pin_thread = None
        if cfg.pin_memory:
            self.pin_done = threading.Event()
            self.data_queue = queue.Queue()
            self.pin_thread = threading.Thread(
                target=_pin_memory_loop, daemon=True,
                args=(self.worker_result_queue, self.data_queue, self.pin_done))
            self.pin_thread.start()
        else:
            self.data_queue = self.worker_result_queue
        _worker_pids[id(self)] = {w.pid for w in self.workers}
        _set_sigchld_handler()
        self.shutdown = False
        _live_iters.append(self)
        self.send_idx = self.rcvd_idx = self.tasks_outstanding = 0
        self.task_info = {}
        self.worker_cycle = itertools.cycle(range(cfg.workers))
        for _ in range(cfg.prefetch_factor * cfg.workers):
            self._try_put_index()

    def __iter__(self):
        return self

    def _try_put_index(self):
        if self.send_idx >= self.num_batches:
            return
        for _ in range(self.cfg.workers):
            worker = next(self.worker_cycle)
            if self.workers_status[worker]:
                break
        else:
            return
        self.index_queues[worker].put((self.send_idx, self.send_idx))
        self.task_info[self.send_idx] = (worker,)
        self.tasks_outstanding += 1
        self.send_idx += 1

    def _try_get_data(self, timeout=MP_STATUS_CHECK_INTERVAL):
        try:
            return True, self.data_queue.get(timeout=timeout)
        except Exception as e:
            failed = []
            for wid, w in enumerate(self.workers):
                if self.workers_status[wid] and not w.is_alive():
                    failed.append(w)
                    self._mark_worker_unavailable(wid)
            if failed:
                pids = ", ".join(str(w.pid) for w in failed)
                raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly") from e
            if isinstance(e, queue.Empty):
                return False, None
            try:
                # PyTorch probes whether it is this close to the fd limit
                [tempfile.NamedTemporaryFile() for _ in range(10)]
            except OSError as probe:
                if probe.errno == errno.EMFILE:
                    raise RuntimeError(
                        "Too many open files. Communication with the workers is no longer "
                        "possible. Please increase the limit using `ulimit -n` in the shell "
                        "or change the sharing strategy by calling "
                        "`torch.multiprocessing.set_sharing_strategy('file_system')` "
                        "at the beginning of your code") from None
            raise

    def _get_data(self):
        if self.pin_thread is not None:
            while self.pin_thread.is_alive():
                ok, data = self._try_get_data()
                if ok:
                    return data
            raise RuntimeError("Pin memory thread exited unexpectedly")
        while True:
            ok, data = self._try_get_data()
            if ok:
                return data

    def __next__(self):
        try:
            return self._next_data()
        except BaseException:
            self._shutdown_workers()
            raise

    def _next_data(self):
        while True:
            if self.rcvd_idx >= self.num_batches:
                self._shutdown_workers()
                raise StopIteration
            info = self.task_info.get(self.rcvd_idx)
            if info is not None and len(info) == 2:
                del self.task_info[self.rcvd_idx]
                return self._process_data(info[1])
            idx, data = self._get_data()
            self.tasks_outstanding -= 1
            if idx != self.rcvd_idx:
                self.task_info[idx] += (data,)
                continue
            del self.task_info[idx]
            return self._process_data(data)

    def _process_data(self, data):
        self.rcvd_idx += 1
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _mark_worker_unavailable(self, wid, shutdown=False):
        self.index_queues[wid].put(None)
        self.workers_status[wid] = False

    def _shutdown_workers(self):
        if self.shutdown:
            return
        self.shutdown = True
        _worker_pids.pop(id(self), None)
        try:
            if self.pin_thread is not None:
                self.pin_done.set()
                self.worker_result_queue.put((None, None))
                self.pin_thread.join(MP_STATUS_CHECK_INTERVAL)
            self.done_event.set()
            for wid in range(len(self.workers)):
                if self.workers_status[wid]:
                    self._mark_worker_unavailable(wid, shutdown=True)
            for w in self.workers:
                w.join(timeout=MP_STATUS_CHECK_INTERVAL)
            for q in self.index_queues:
                q.cancel_join_thread()
                q.close()
            self.worker_result_queue.cancel_join_thread()
            self.worker_result_queue.close()
        finally:
            for w in self.workers:
                if w.is_alive():
                    w.terminate()
            if self in _live_iters:
                _live_iters.remove(self)


def add_loader_flags(parser, batch_bytes_default):
    """The DataLoader knobs every PyTorch-like workload takes."""
    from _workload import parse_size
    parser.add_argument("--batch-bytes", type=parse_size, default=batch_bytes_default,
                        help="bytes of tensor data in one batch (K/M/G suffixes)")
    parser.add_argument("--tensors-per-batch", type=int, default=1,
                        help="the batch is split into this many tensors, one /dev/shm "
                             "object (and one fd) each")
    parser.add_argument("--workers", type=int, default=2, help="num_workers")
    parser.add_argument("--prefetch-factor", type=int, default=2,
                        help="batches in flight per worker (PyTorch default 2)")
    parser.add_argument("--batches", type=int, default=8, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--start-method", choices=["fork", "forkserver"], default="fork",
                        help="multiprocessing start method (forkserver is the default "
                             "from Python 3.14)")
    parser.add_argument("--pin-memory", action="store_true",
                        help="run a `pt_data_pin` thread in the trainer that receives "
                             "the batches and copies them out of /dev/shm")
    parser.add_argument("--no-rename", dest="rename", action="store_false",
                        help="do not rename workers `pt_data_worker` (PyTorch < 2.5)")
    parser.add_argument("--load-ms", type=float, default=0,
                        help="time a worker spends loading a batch before collating")
    parser.add_argument("--step-ms", type=float, default=100,
                        help="time the trainer spends on each batch; slower steps let "
                             "prefetched batches pile up in /dev/shm")


def sem_pages(cfg):
    """SemLocks the loader creates, one tmpfs page each (the sem.* file stays
    mapped after its unlink): 3 per multiprocessing.Queue (workers' index
    queues and the result queue) and 5 for the Event."""
    return (3 * (cfg.workers + 1) + 5) * pages(1)


def required_shm(cfg):
    """Upper bound of /dev/shm bytes in use at once. Batches: the
    prefetch_factor x workers outstanding ones, the one just received and the
    one the training loop still holds while asking for the next. From the
    second epoch on, forked workers also inherit the fd and mapping of the
    previous epoch's last batch (still bound to the loop variable when the
    new workers fork), which keeps it alive for the whole epoch."""
    batches = cfg.workers * cfg.prefetch_factor + 2
    if cfg.start_method == "fork" and cfg.epochs > 1:
        batches += 1
    return batches * batch_pages(cfg) + sem_pages(cfg)


def batch_pages(cfg):
    """tmpfs bytes of one batch: one file per tensor, whole pages, plus the
    64-byte refcount header under the file_system strategy."""
    header = MAP_ALLOC_ALIGNMENT if getattr(cfg, "strategy", "") == "file_system" else 0
    return cfg.tensors_per_batch * pages(cfg.batch_bytes // cfg.tensors_per_batch + header)


def train_step(cfg, batch):
    for t in batch:
        ctypes.string_at(t.addr, 1)  # read the data
    if cfg.step_ms:
        time.sleep(cfg.step_ms / 1000)
