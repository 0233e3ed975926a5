#!/bin/sh
# Check every workload against a real small /dev/shm: with 1 MiB it must fail
# with its documented exit status; with the size its --required-shm prints it
# must succeed. Needs root (a private mount namespace per run).
#   tests/workloads/selfcheck.sh [python3]
# In Docker instead: SHMCHECK_DOCKER=image tests/workloads/selfcheck.sh /usr/bin/python3
# (python is bind-mounted read-only from the host; the image needs only sh).
set -u
PY=${1:-python3}
PY=$(command -v "$PY")
DIR=$(cd "$(dirname "$0")" && pwd)
fails=0

# run SIZE CMD...: run CMD with a private tmpfs of SIZE bytes on /dev/shm
run() {
    size=$1; shift
    if [ -n "${SHMCHECK_DOCKER:-}" ]; then
        prefix=$("$PY" -c 'import sys; print(sys.base_prefix)')
        docker run --rm --network none --shm-size "$size" \
            -v /usr:/usr:ro -v /lib:/lib:ro -v /lib64:/lib64:ro \
            -v "$prefix:$prefix:ro" -v "$DIR:$DIR:ro" -e NCCL_SHM_DISABLE \
            -w "$DIR" "$SHMCHECK_DOCKER" "$@"
    else
        unshare -m sh -c 'mount --make-rprivate / && mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"' "$size" "$@"
    fi
}

# expect WANT_SMALL ARGS...: 1 MiB must give WANT_SMALL, the required size 0
expect() {
    want=$1; shift
    run 1048576 "$PY" -B "$DIR/$@" >/dev/null 2>&1
    got=$?
    need=$("$PY" -B "$DIR/$@" --required-shm)
    run "$need" "$PY" -B "$DIR/$@" >/dev/null 2>&1
    ok=$?
    if [ "$got" = "$want" ] && [ "$ok" = 0 ]; then r=ok; else r=FAIL; fails=$((fails + 1)); fi
    echo "$r: $* -> $got with 1 MiB (want $want), $ok with $need bytes"
}

expect 1 pytorch_fallocate.py
expect 1 pytorch_fallocate.py --start-method forkserver --pin-memory --batch-bytes 1M
expect 1 pytorch_fallocate.py --errno-bug stale
expect 1 pytorch_mmap_sigbus.py
expect 1 nccl_shm.py
expect 1 nccl_shm.py --legacy
expect 135 shared_memory_sigbus.py
expect 1 shared_memory_sigbus.py --workers 2
expect 1 semaphore_enospc.py --fill-bytes 1M
expect 1 file_system_strategy.py

# fd_limit: fails in 1 MiB and in a large /dev/shm alike; a higher --nofile fixes it
run 1048576 "$PY" -B "$DIR/fd_limit.py" >/dev/null 2>&1; small=$?
run 67108864 "$PY" -B "$DIR/fd_limit.py" >/dev/null 2>&1; big=$?
n=$("$PY" -B "$DIR/fd_limit.py" --required-nofile)
run 1048576 "$PY" -B "$DIR/fd_limit.py" --nofile "$n" >/dev/null 2>&1; fixed=$?
if [ $small = 1 ] && [ $big = 1 ] && [ $fixed = 0 ]; then r=ok; else r=FAIL; fails=$((fails + 1)); fi
echo "$r: fd_limit.py -> $small with 1 MiB, $big with 64 MiB, $fixed with --nofile $n"

echo "$fails failed"
[ $fails = 0 ]
