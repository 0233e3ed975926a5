//! The diagnosis of a real workload in a real Docker container with `--shm-size 1m`, and the
//! recommended size checked by rerunning it in a container of that size. The same workloads
//! in a private /dev/shm, without Docker, are in `kernel_diagnosis.rs`.
use shmtrace_tests::{
    diagnosis::*,
    serial,
    workload::{MIB, Workload},
};

/// A real Docker container with `--shm-size 1m`, traced by name from the start: the PyTorch
/// fallocate failure, diagnosed with the container's name and its /dev/shm; rerun in a
/// container with `--shm-size <min_bytes>b`, it succeeds.
#[test]
fn docker_container_with_a_1m_shm() {
    let _guard = serial();
    let script = "pytorch_fallocate.py";
    let workload = Workload::new(script, &[]);
    let run = workload.trace_in_docker(MIB);
    let dump = || run.dump();
    assert_eq!(run.exit_code, 1, "{}", dump());
    let trainer = main_pid(&run.records, script);

    let failed = shm_full(&run.records);
    assert!(!failed.is_empty(), "no /dev/shm diagnosis:\n{}", dump());
    for d in &failed {
        assert_worker_of(d, trainer, script, 2);
        assert_shm_full(d, MIB, &dump);
        assert_eq!(d["container"]["name"], run.name.as_str(), "{d}");
        assert_eq!(d["container"]["runtime"], "docker", "{d}");
        assert_eq!(d["container"]["shm_size"], MIB, "{d}");
        assert_eq!(d["place"], run.name.as_str(), "{d}");
        assert_eq!(d["recommendation"]["preferred"], "docker", "{d}");
        // torch_<pid>_: the pid inside the container, not the host's.
        assert_call(
            &d["failures"][0],
            "fallocate",
            "ENOSPC",
            "/dev/shm/torch_",
            256 << 10,
        );
    }
    assert_trainer_follows(&run.records, trainer, &failed);
    assert_summary(&run.records);

    let size = recommended(&workload, &run.records);
    let rerun = workload.trace_in_docker(size);
    assert_eq!(
        rerun.exit_code,
        0,
        "with --shm-size {size}b:\n{}",
        rerun.dump()
    );
    assert_nothing_to_diagnose(&rerun.records, &|| rerun.dump());
}
