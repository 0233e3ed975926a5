#!/usr/bin/env python3
"""A real MPI job (Open MPI and mpi4py from Debian): ranks pass a buffer around a ring
and reduce a checksum, through Open MPI's shared-memory transport (its segments are
files in /dev/shm). Run under mpirun:

    mpirun --allow-run-as-root --oversubscribe -np 4 /usr/bin/python3 -B mpi_ring.py --bytes 1M

Exits 0 when every rank received what its neighbour sent.
"""

import argparse
import array
import sys

from mpi4py import MPI

from _workload import parse_size


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=parse_size, default=1 << 20,
                   help="the buffer each rank passes on, each round")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    received = bytearray(args.bytes)
    good = 0
    for round_ in range(args.rounds):
        sent = bytearray([(rank + round_) % 256]) * args.bytes
        comm.Sendrecv(sent, dest=right, recvbuf=received, source=left)
        good += received == bytearray([(left + round_) % 256]) * args.bytes
    total = array.array("d", [0.0])
    comm.Allreduce(array.array("d", [float(good)]), total, op=MPI.SUM)
    if rank == 0:
        print(f"{size} ranks, {args.rounds} rounds of {args.bytes} bytes: "
              f"{int(total[0])} of {size * args.rounds} received right")
    sys.exit(0 if total[0] == size * args.rounds else 1)


if __name__ == "__main__":
    main()
