//! The Kubernetes manifests (deploy/kubernetes/), rendered by the real `kubectl kustomize`,
//! validated strictly: every object deserialises into the Kubernetes API types of the version
//! pinned here (k8s-openapi, feature `v1_32`), and any field those types do not know fails the
//! test (serde_ignored collects what a lenient parse would have skipped). The ServiceMonitor is
//! a CRD of the Prometheus operator, which k8s-openapi does not have: it is checked against a
//! small typed struct of our own with `deny_unknown_fields`, covering only the fields we use.
//! Fails loudly without kubectl.
use std::{path::PathBuf, process::Command};

use k8s_openapi::{
    api::{apps::v1::DaemonSet, core::v1::Namespace, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_norway::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitor {
    #[allow(dead_code, reason = "checked by deserialising")]
    api_version: String,
    #[allow(dead_code, reason = "checked by deserialising")]
    kind: String,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MonitorEndpoint {
    port: String,
    path: Option<String>,
    interval: Option<String>,
    #[serde(default)]
    relabelings: Vec<Relabeling>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Relabeling {
    source_labels: Vec<String>,
    target_label: String,
}

fn render() -> Vec<Value> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl is not installed");
    assert!(
        output.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .collect()
}

/// Deserialises `value` as `T`, failing on any field `T` does not know.
fn strict<T: DeserializeOwned>(value: &Value) -> Result<T, String> {
    let mut ignored = Vec::new();
    let typed = serde_ignored::deserialize(value.clone(), |path| ignored.push(path.to_string()))
        .map_err(|e| e.to_string())?;
    if ignored.is_empty() {
        Ok(typed)
    } else {
        Err(format!("unknown fields: {ignored:?}"))
    }
}

fn kind(value: &Value) -> &str {
    value["kind"].as_str().unwrap_or("")
}

#[test]
fn every_rendered_object_is_a_valid_kubernetes_object() {
    let objects = render();
    let kinds: Vec<&str> = objects.iter().map(kind).collect();
    assert_eq!(
        kinds,
        ["Namespace", "Service", "DaemonSet", "ServiceMonitor"],
        "{objects:?}"
    );
    let mut daemonset = None;
    let mut service = None;
    let mut monitor = None;
    for object in &objects {
        match kind(object) {
            "Namespace" => {
                let namespace: Namespace = strict(object).unwrap();
                assert_eq!(namespace.metadata.name.as_deref(), Some("shmtrace"));
            }
            "Service" => service = Some(strict::<Service>(object).unwrap()),
            "DaemonSet" => daemonset = Some(strict::<DaemonSet>(object).unwrap()),
            "ServiceMonitor" => monitor = Some(strict::<ServiceMonitor>(object).unwrap()),
            other => panic!("an object of a kind this test does not validate: {other}"),
        }
    }

    let daemonset = daemonset.unwrap();
    let pod = daemonset.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_pid, Some(true));
    let container = &pod.containers[0];
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(
        security.privileged,
        Some(false),
        "capabilities, not privilege"
    );
    let added = security.capabilities.as_ref().unwrap().add.clone().unwrap();
    for needed in ["BPF", "PERFMON", "SYS_PTRACE"] {
        assert!(
            added.iter().any(|c| c == needed),
            "{needed} not in {added:?}"
        );
    }
    let mounts: Vec<&str> = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    for path in [
        "/sys/kernel/btf",
        "/sys/kernel/tracing",
        "/run/containerd/containerd.sock",
    ] {
        assert!(mounts.contains(&path), "{path} not mounted: {mounts:?}");
    }
    let args = container.args.clone().unwrap();
    assert_eq!(args[0], "daemon");
    assert!(
        args.contains(&"--listen=0.0.0.0:9184".to_owned()),
        "{args:?}"
    );
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/shmtrace/shmtrace:0.1.0")
    );

    // The Service selects the DaemonSet's pods on the port the daemon listens on, and the
    // ServiceMonitor selects the Service by that port's name.
    let service = service.unwrap();
    let service_spec = service.spec.unwrap();
    let port = &service_spec.ports.unwrap()[0];
    assert_eq!(port.port, 9184);
    let pod_labels = daemonset.metadata.labels.unwrap();
    for (key, value) in service_spec.selector.unwrap() {
        assert_eq!(pod_labels.get(&key), Some(&value), "selector {key}");
    }
    let monitor = monitor.unwrap();
    assert_eq!(monitor.spec.endpoints[0].port, port.name.clone().unwrap());
    assert_eq!(monitor.spec.endpoints[0].path.as_deref(), Some("/metrics"));
    assert!(monitor.spec.endpoints[0].interval.is_some());
    assert_eq!(
        monitor.spec.selector.match_labels.unwrap()["app.kubernetes.io/name"],
        "shmtrace"
    );
    assert!(monitor.metadata.name.is_some());
    assert_eq!(
        monitor.spec.endpoints[0].relabelings[0].target_label,
        "node"
    );
    assert!(
        !monitor.spec.endpoints[0].relabelings[0]
            .source_labels
            .is_empty()
    );
}

#[test]
fn the_validation_refuses_a_misspelt_field() {
    let mut objects = render();
    let daemonset = objects.iter_mut().find(|o| kind(o) == "DaemonSet").unwrap();
    // `hostPid` instead of `hostPID`: a lenient parse would drop it, and the pod would not see
    // the host's processes.
    let pod = &mut daemonset["spec"]["template"]["spec"];
    let host_pid = pod
        .as_mapping_mut()
        .unwrap()
        .remove("hostPID")
        .expect("hostPID is set");
    pod.as_mapping_mut()
        .unwrap()
        .insert("hostPid".into(), host_pid);
    let error = strict::<DaemonSet>(daemonset).unwrap_err();
    assert!(error.contains("hostPid"), "{error}");

    let monitor = objects
        .iter_mut()
        .find(|o| kind(o) == "ServiceMonitor")
        .unwrap();
    monitor["spec"]["endpoints"][0]
        .as_mapping_mut()
        .unwrap()
        .insert("scrapeIntervall".into(), "30s".into());
    let error = strict::<ServiceMonitor>(monitor).unwrap_err();
    assert!(error.contains("scrapeIntervall"), "{error}");
}
