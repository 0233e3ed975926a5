//! Which runtime and platform this process runs on, as far as they can be recognised from
//! inside, and how a /dev/shm is given more room there, in that platform's own terms.
use std::{collections::HashMap, fs, path::Path};

use serde::Serialize;

/// Who made the container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    Docker,
    Podman,
    Kubernetes,
    Apptainer,
    /// Signs of a container, but of no runtime recognised.
    UnknownContainer,
    /// No sign of a container.
    None,
}

/// A sandbox between the container and the kernel, whose /dev/shm numbers are its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sandbox {
    Gvisor,
    Kata,
}

/// A managed platform, recognised by the environment it sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Managed {
    Sagemaker,
    VertexAi,
    AzureMl,
    Colab,
    Kaggle,
    Databricks,
    Slurm,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Platform {
    pub runtime: Runtime,
    pub sandbox: Option<Sandbox>,
    pub managed: Option<Managed>,
    /// Podman's `rootless=1`.
    pub rootless: bool,
    /// What each conclusion rests on.
    pub evidence: Vec<String>,
}

/// What is looked at, gathered once so that recognising is a pure function.
#[derive(Default)]
pub struct Clues {
    pub env: HashMap<String, String>,
    /// Paths that exist, of those in [`PATHS`].
    pub existing: Vec<&'static str>,
    pub containerenv: String,
    pub proc_version: String,
    pub proc_cmdline: String,
    pub cgroup: String,
}

const DOCKERENV: &str = "/.dockerenv";
const CONTAINERENV: &str = "/run/.containerenv";
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const SAGEMAKER_METADATA: &str = "/opt/ml/metadata/resource-metadata.json";
const SAGEMAKER_INPUT: &str = "/opt/ml/input/config";
const PATHS: [&str; 5] = [
    DOCKERENV,
    CONTAINERENV,
    SERVICE_ACCOUNT,
    SAGEMAKER_METADATA,
    SAGEMAKER_INPUT,
];

impl Clues {
    pub fn gather() -> Clues {
        let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
        Clues {
            env: std::env::vars().collect(),
            existing: PATHS
                .into_iter()
                .filter(|path| Path::new(path).exists())
                .collect(),
            containerenv: read(CONTAINERENV),
            proc_version: read("/proc/version"),
            proc_cmdline: read("/proc/cmdline"),
            cgroup: read("/proc/self/cgroup"),
        }
    }

    fn has(&self, path: &str) -> bool {
        self.existing.contains(&path)
    }

    fn env(&self, name: &str) -> bool {
        self.env.get(name).is_some_and(|v| !v.is_empty())
    }

    fn env_prefix(&self, prefix: &str) -> Option<&str> {
        self.env
            .keys()
            .filter(|k| k.starts_with(prefix))
            .min()
            .map(String::as_str)
    }
}

/// Recognises the platform from `clues`.
pub fn recognise(clues: &Clues) -> Platform {
    let mut evidence = Vec::new();
    let mut note = |what: &str| evidence.push(what.to_owned());
    let kubernetes = clues.env("KUBERNETES_SERVICE_HOST") || clues.has(SERVICE_ACCOUNT);
    let apptainer = ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"]
        .into_iter()
        .find(|v| clues.env(v));
    let runtime = if kubernetes {
        note(if clues.env("KUBERNETES_SERVICE_HOST") {
            "KUBERNETES_SERVICE_HOST is set"
        } else {
            "a Kubernetes service account is mounted"
        });
        Runtime::Kubernetes
    } else if clues.has(CONTAINERENV) {
        note("/run/.containerenv exists");
        Runtime::Podman
    } else if clues.has(DOCKERENV) {
        note("/.dockerenv exists");
        Runtime::Docker
    } else if let Some(variable) = apptainer {
        note(&format!("{variable} is set"));
        Runtime::Apptainer
    } else if clues.cgroup.lines().any(|line| {
        ["/docker", "/libpod", "/kubepods", "/containerd", "/crio"]
            .iter()
            .any(|marker| line.contains(marker))
    }) {
        note("/proc/self/cgroup names a container's cgroup");
        Runtime::UnknownContainer
    } else {
        Runtime::None
    };
    let rootless = clues.containerenv.lines().any(|l| l.trim() == "rootless=1");
    if rootless {
        note("/run/.containerenv says rootless=1");
    }
    // gVisor reports a fixed, fictitious kernel build; Kata's guest kernel is booted by its
    // agent, whose options show on the kernel's command line.
    let sandbox = if clues.proc_version.contains("gvisor")
        || clues
            .proc_version
            .contains("#1 SMP Sun Jan 10 15:06:54 PST 2016")
    {
        note("/proc/version is gVisor's");
        Some(Sandbox::Gvisor)
    } else if clues
        .proc_cmdline
        .split_whitespace()
        .any(|option| option.starts_with("agent.") || option.contains("kata"))
    {
        note("the kernel's command line is a Kata guest's");
        Some(Sandbox::Kata)
    } else {
        None
    };
    let managed = if clues.env("SM_CURRENT_HOST")
        || clues.env("TRAINING_JOB_NAME")
        || clues.has(SAGEMAKER_METADATA)
        || clues.has(SAGEMAKER_INPUT)
    {
        note("SageMaker's environment (SM_CURRENT_HOST, TRAINING_JOB_NAME or /opt/ml)");
        Some(Managed::Sagemaker)
    } else if clues.env("CLOUD_ML_JOB_ID") || clues.env_prefix("AIP_").is_some() {
        note("Vertex AI's environment (CLOUD_ML_JOB_ID or AIP_*)");
        Some(Managed::VertexAi)
    } else if let Some(variable) = clues.env_prefix("AZUREML_") {
        note(&format!("Azure ML's environment ({variable})"));
        Some(Managed::AzureMl)
    } else if clues.env("COLAB_RELEASE_TAG") || clues.env("COLAB_GPU") {
        note("Colab's environment (COLAB_RELEASE_TAG)");
        Some(Managed::Colab)
    } else if clues.env("KAGGLE_KERNEL_RUN_TYPE") {
        note("Kaggle's environment (KAGGLE_KERNEL_RUN_TYPE)");
        Some(Managed::Kaggle)
    } else if clues.env("DATABRICKS_RUNTIME_VERSION") {
        note("Databricks' environment (DATABRICKS_RUNTIME_VERSION)");
        Some(Managed::Databricks)
    } else if clues.env("SLURM_JOB_ID") {
        note("a Slurm job (SLURM_JOB_ID)");
        Some(Managed::Slurm)
    } else {
        None
    };
    Platform {
        runtime,
        sandbox,
        managed,
        rootless,
        evidence,
    }
}

impl Platform {
    /// What to call it, for people: `Docker`, `Kubernetes on gVisor`, `SageMaker (Docker)`.
    pub fn describe(&self) -> String {
        let runtime = match self.runtime {
            Runtime::Docker => "a Docker container",
            Runtime::Podman if self.rootless => "a rootless Podman container",
            Runtime::Podman => "a Podman container",
            Runtime::Kubernetes => "a Kubernetes pod",
            Runtime::Apptainer => "an Apptainer (Singularity) container",
            Runtime::UnknownContainer => "a container of an unrecognised runtime",
            Runtime::None => "no container",
        };
        let mut text = match self.managed {
            Some(managed) => format!("{} ({runtime})", managed_name(managed)),
            None => runtime.to_owned(),
        };
        match self.sandbox {
            Some(Sandbox::Gvisor) => text.push_str(", in gVisor"),
            Some(Sandbox::Kata) => text.push_str(", in a Kata VM"),
            None => {}
        }
        text
    }

    /// How to give /dev/shm `size` (as people write it: `1g`) here, one way per line.
    pub fn shm_fixes(&self, size: &str) -> Vec<String> {
        let mut fixes = Vec::new();
        match self.managed {
            Some(Managed::Sagemaker) => fixes.push(format!(
                "SageMaker training jobs take no --shm-size (aws/sagemaker-python-sdk#937): make \
                 the workload fit in {size}: fewer DataLoader workers, a smaller prefetch_factor \
                 or smaller batches; in local mode, add shm_size to docker's host config"
            )),
            Some(Managed::VertexAi) => fixes.push(format!(
                "Vertex AI: a serving container takes serving_container_shared_memory_size_mb \
                 (Model.upload); a custom training job whose /dev/shm is fixed must make the \
                 workload fit in {size}: fewer DataLoader workers, a smaller prefetch_factor"
            )),
            Some(Managed::AzureMl) => fixes.push(format!(
                "Azure ML: set the job's shared memory, resources.shm_size: {size} in its YAML \
                 (shm_size= in the SDK's command())"
            )),
            Some(Managed::Colab | Managed::Kaggle) => fixes.push(format!(
                "this notebook's /dev/shm is fixed by the platform: make the workload fit in \
                 {size}: fewer DataLoader workers, a smaller prefetch_factor or smaller batches"
            )),
            Some(Managed::Databricks) => fixes.push(format!(
                "Databricks: /dev/shm is the cluster node's; pick a node type with more memory, \
                 or make the workload fit in {size}"
            )),
            Some(Managed::Slurm) | None => {}
        }
        match self.runtime {
            Runtime::Docker => {
                fixes.push(format!("docker run --shm-size={size} ..."));
                fixes.push(format!(
                    "docker compose: shm_size: {size} under the service"
                ));
            }
            Runtime::Podman => fixes.push(format!("podman run --shm-size={size} ...")),
            Runtime::Kubernetes => fixes.push(format!(
                "Kubernetes: mount an emptyDir at /dev/shm: volumes: [{{name: dshm, emptyDir: \
                 {{medium: Memory, sizeLimit: {}}}}}] and volumeMounts: [{{name: dshm, \
                 mountPath: /dev/shm}}]; its pages count against the container's memory limit, \
                 so raise resources.limits.memory by as much",
                kubernetes_quantity(size)
            )),
            Runtime::Apptainer => fixes.push(
                "Apptainer shares the host's /dev/shm: its size is the node's (ask the cluster's \
                 administrators), and a Slurm job's --mem limits its pages too"
                    .to_owned(),
            ),
            Runtime::UnknownContainer => fixes.push(format!(
                "give the container's /dev/shm {size}: --shm-size={size} (Docker, Podman, \
                 nerdctl), or in Kubernetes an emptyDir of medium Memory mounted at /dev/shm"
            )),
            Runtime::None if self.managed.is_none() => fixes.push(format!(
                "as root: mount -o remount,size={size} /dev/shm (and in /etc/fstab to keep it)"
            )),
            Runtime::None => {}
        }
        if self.managed == Some(Managed::Slurm) && self.runtime != Runtime::Apptainer {
            fixes.push(
                "Slurm: /dev/shm is the node's, and the job's --mem limits its pages: ask for \
                 more memory (--mem) or a node with a larger /dev/shm"
                    .to_owned(),
            );
        }
        match self.sandbox {
            Some(Sandbox::Gvisor) => fixes.push(
                "gVisor: its statfs of /dev/shm is its own and may be wrong (google/gvisor#1936): \
                 the sandbox's memory limit is what bounds /dev/shm there"
                    .to_owned(),
            ),
            Some(Sandbox::Kata) => fixes.push(
                "Kata: /dev/shm lives in the VM and has ignored --shm-size and sizeLimit \
                 (kata-containers#21, #2438): trust the numbers above, not the setting, and \
                 give the VM memory (its sandbox's size)"
                    .to_owned(),
            ),
            None => {}
        }
        fixes
    }

    /// How to raise the memory limit here.
    pub fn memory_fix(&self) -> String {
        match self.runtime {
            Runtime::Docker => "docker run --memory=... (compose: mem_limit)".to_owned(),
            Runtime::Podman => "podman run --memory=...".to_owned(),
            Runtime::Kubernetes => {
                "Kubernetes: resources.limits.memory of the container".to_owned()
            }
            _ => "raise the memory limit of the container or job".to_owned(),
        }
    }
}

fn managed_name(managed: Managed) -> &'static str {
    match managed {
        Managed::Sagemaker => "SageMaker",
        Managed::VertexAi => "Vertex AI",
        Managed::AzureMl => "Azure ML",
        Managed::Colab => "Colab",
        Managed::Kaggle => "Kaggle",
        Managed::Databricks => "Databricks",
        Managed::Slurm => "Slurm",
    }
}

/// `1g` → `1Gi`, `512m` → `512Mi`: Kubernetes writes binary units with an `i`.
fn kubernetes_quantity(size: &str) -> String {
    match size.char_indices().last() {
        Some((i, unit @ ('k' | 'm' | 'g' | 'K' | 'M' | 'G'))) => {
            format!("{}{}i", &size[..i], unit.to_ascii_uppercase())
        }
        _ => size.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clues(env: &[(&str, &str)], existing: &[&'static str]) -> Clues {
        Clues {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            existing: existing.to_vec(),
            ..Clues::default()
        }
    }

    #[test]
    fn recognises_runtimes_by_their_marks() {
        assert_eq!(
            recognise(&clues(&[], &[DOCKERENV])).runtime,
            Runtime::Docker
        );
        let podman = Clues {
            containerenv: "engine=\"podman-4.3.1\"\nrootless=1\n".into(),
            ..clues(&[], &[CONTAINERENV])
        };
        let podman = recognise(&podman);
        assert_eq!(podman.runtime, Runtime::Podman);
        assert!(podman.rootless);
        assert_eq!(podman.describe(), "a rootless Podman container");
        let pod = recognise(&clues(
            &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")],
            &[DOCKERENV],
        ));
        assert_eq!(pod.runtime, Runtime::Kubernetes);
        assert!(
            pod.shm_fixes("2g")[0].contains("sizeLimit: 2Gi"),
            "{:?}",
            pod.shm_fixes("2g")
        );
        let host = recognise(&clues(&[], &[]));
        assert_eq!(host.runtime, Runtime::None);
        assert!(host.shm_fixes("1g")[0].contains("remount,size=1g"));
        let unknown = Clues {
            cgroup: "0::/kubepods.slice/x\n".into(),
            ..Clues::default()
        };
        assert_eq!(recognise(&unknown).runtime, Runtime::UnknownContainer);
    }

    #[test]
    fn recognises_sandboxes_and_managed_platforms() {
        let gvisor = Clues {
            proc_version: "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n".into(),
            ..clues(&[], &[DOCKERENV])
        };
        let gvisor = recognise(&gvisor);
        assert_eq!(gvisor.sandbox, Some(Sandbox::Gvisor));
        assert!(
            gvisor
                .shm_fixes("1g")
                .iter()
                .any(|f| f.contains("gvisor#1936"))
        );
        let kata = Clues {
            proc_cmdline: "console=hvc0 agent.log=debug quiet\n".into(),
            ..Clues::default()
        };
        assert_eq!(recognise(&kata).sandbox, Some(Sandbox::Kata));
        let sagemaker = recognise(&clues(&[("SM_CURRENT_HOST", "algo-1")], &[DOCKERENV]));
        assert_eq!(sagemaker.managed, Some(Managed::Sagemaker));
        assert_eq!(sagemaker.describe(), "SageMaker (a Docker container)");
        assert!(sagemaker.shm_fixes("1g")[0].contains("sagemaker-python-sdk#937"));
        let azure = recognise(&clues(&[("AZUREML_RUN_ID", "x")], &[DOCKERENV]));
        assert!(azure.shm_fixes("8g")[0].contains("shm_size: 8g"));
        assert_eq!(
            recognise(&clues(&[("AIP_MODEL_DIR", "gs://x")], &[])).managed,
            Some(Managed::VertexAi)
        );
        assert_eq!(
            recognise(&clues(&[("COLAB_RELEASE_TAG", "r")], &[])).managed,
            Some(Managed::Colab)
        );
        let slurm = recognise(&clues(
            &[("SLURM_JOB_ID", "12"), ("APPTAINER_CONTAINER", "/x.sif")],
            &[],
        ));
        assert_eq!(slurm.runtime, Runtime::Apptainer);
        assert_eq!(slurm.managed, Some(Managed::Slurm));
        assert!(slurm.shm_fixes("1g")[0].contains("host's /dev/shm"));
        // Empty variables are no evidence.
        assert_eq!(
            recognise(&clues(&[("SLURM_JOB_ID", "")], &[])).managed,
            None
        );
    }

    #[test]
    fn writes_kubernetes_quantities() {
        assert_eq!(kubernetes_quantity("1g"), "1Gi");
        assert_eq!(kubernetes_quantity("512M"), "512Mi");
        assert_eq!(kubernetes_quantity("4096"), "4096");
        assert_eq!(kubernetes_quantity("SIZE"), "SIZE");
    }
}
