//! The Docker Engine API's event stream (`GET /events`), and Podman's Docker-compatible one:
//! each container as it is created, started, renamed, dies and is removed, with the name and
//! labels it had then. A container that `docker run --rm` removes within a second of its start
//! is gone before any list of the runtime shows it; its events still name it.
use std::{collections::BTreeMap, path::Path, time::Duration};

use http_body_util::BodyExt;
use serde::Deserialize;

use super::{
    Runtime,
    client::{RuntimeClient, kube_labels},
    docker::{DockerClient, DockerError},
    unix_http::HttpError,
};

/// What happened to a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Created,
    Started,
    Renamed,
    Died,
    Destroyed,
}

/// One event of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEvent {
    pub runtime: Runtime,
    pub action: Action,
    pub id: String,
    /// As the runtime names it at this event (after a rename, the new name).
    pub name: String,
    pub image: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    /// The container's labels (the event's attributes but the runtime's own keys).
    pub labels: BTreeMap<String, String>,
    /// When, as the runtime says it: Unix time, nanoseconds.
    pub time_ns: i64,
}

/// The attributes the runtimes put beside a container's labels in its events.
const OWN_ATTRIBUTES: [&str; 8] = [
    "name",
    "image",
    "exitCode",
    "oldName",
    "signal",
    "containerExitCode",
    "podId",
    "execID",
];

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Message {
    #[serde(default, rename = "Type")]
    kind: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    actor: Actor,
    #[serde(default, rename = "timeNano")]
    time_nano: i64,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Actor {
    #[serde(default, rename = "ID")]
    id: String,
    #[serde(default)]
    attributes: Option<BTreeMap<String, String>>,
}

/// `?filters=` for the container events this module reads, URL-encoded
/// (`{"type":["container"],"event":["create","start","rename","die","destroy"]}`).
const FILTERS: &str = "%7B%22type%22%3A%5B%22container%22%5D%2C%22event%22%3A%5B%22create%22%2C\
                       %22start%22%2C%22rename%22%2C%22die%22%2C%22destroy%22%5D%7D";

/// Most bytes of one event; a longer line is dropped (a container with megabytes of labels
/// must not grow the reader without bound).
const MAX_LINE: usize = 1 << 20;

/// Reads the event stream of the runtime at `socket` until it ends, handing each container
/// event to `sink`. With `since_ns`, events from then on come first (those missed while the
/// stream was down). Returns the time of the last event read.
pub async fn watch(
    socket: &Path,
    runtime: Runtime,
    timeout: Duration,
    since_ns: Option<i64>,
    mut sink: impl FnMut(RuntimeEvent),
) -> Result<Option<i64>, DockerError> {
    let client = DockerClient::connect(socket, runtime, timeout).await?;
    let runtime = client.runtime();
    let mut path = client.versioned(&format!("/events?filters={FILTERS}"));
    if let Some(since) = since_ns {
        path.push_str(&format!(
            "&since={}.{:09}",
            since.div_euclid(1_000_000_000),
            since.rem_euclid(1_000_000_000)
        ));
    }
    let http = |source| DockerError::Http {
        runtime,
        socket: socket.to_owned(),
        source,
    };
    let (status, mut body) = super::unix_http::stream(socket, &path, timeout)
        .await
        .map_err(http)?;
    if !status.is_success() {
        return Err(DockerError::Status {
            runtime,
            socket: socket.to_owned(),
            path,
            status: status.as_u16(),
            message: String::new(),
        });
    }
    let mut last = since_ns;
    let mut line = Vec::new();
    let mut skipping = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| http(HttpError::Protocol(e)))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        for piece in data.split_inclusive(|b| *b == b'\n') {
            let ends = piece.ends_with(b"\n");
            if !skipping {
                line.extend_from_slice(piece);
                if line.len() > MAX_LINE {
                    skipping = true;
                    line.clear();
                }
            }
            if ends {
                if !skipping && let Some(event) = parse(&line, runtime) {
                    last = Some(event.time_ns);
                    sink(event);
                }
                line.clear();
                skipping = false;
            }
        }
    }
    Ok(last)
}

/// One line of the stream, if it is a container event this module reads.
fn parse(line: &[u8], runtime: Runtime) -> Option<RuntimeEvent> {
    let message: Message = serde_json::from_slice(line).ok()?;
    if message.kind != "container" || message.actor.id.is_empty() {
        return None;
    }
    let action = match message.action.as_str() {
        "create" => Action::Created,
        "start" => Action::Started,
        "rename" => Action::Renamed,
        "die" => Action::Died,
        "destroy" => Action::Destroyed,
        _ => return None,
    };
    let mut attributes = message.actor.attributes.unwrap_or_default();
    let name = attributes.get("name").cloned().unwrap_or_default();
    let image = attributes.get("image").cloned().filter(|i| !i.is_empty());
    attributes.retain(|key, _| !OWN_ATTRIBUTES.contains(&key.as_str()));
    let kube = kube_labels(&attributes);
    Some(RuntimeEvent {
        runtime,
        action,
        id: message.actor.id,
        // Docker-compatible APIs give the name without the leading slash.
        name: name.trim_start_matches('/').to_owned(),
        image,
        pod: kube.pod,
        namespace: kube.namespace,
        labels: attributes,
        time_ns: message.time_nano,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_dockers_container_events_with_their_names_and_labels() {
        let line = br#"{"status":"start","id":"3f4e","from":"busybox","Type":"container","Action":"start","Actor":{"ID":"3f4e","Attributes":{"image":"busybox","name":"c0","io.kubernetes.pod.name":"web-0","io.kubernetes.pod.namespace":"shop"}},"scope":"local","time":1700000000,"timeNano":1700000000123456789}"#;
        let event = parse(line, Runtime::Docker).unwrap();
        assert_eq!(event.action, Action::Started);
        assert_eq!(event.id, "3f4e");
        assert_eq!(event.name, "c0");
        assert_eq!(event.image.as_deref(), Some("busybox"));
        assert_eq!(event.pod.as_deref(), Some("web-0"));
        assert_eq!(event.namespace.as_deref(), Some("shop"));
        assert!(!event.labels.contains_key("name"));
        assert_eq!(event.time_ns, 1_700_000_000_123_456_789);
    }

    #[test]
    fn other_events_and_garbage_are_skipped() {
        let network = br#"{"Type":"network","Action":"connect","Actor":{"ID":"n1"}}"#;
        assert_eq!(parse(network, Runtime::Docker), None);
        let exec = br#"{"Type":"container","Action":"exec_start: sh","Actor":{"ID":"c1"}}"#;
        assert_eq!(parse(exec, Runtime::Docker), None);
        assert_eq!(parse(b"{not json", Runtime::Docker), None);
        let no_attributes =
            br#"{"Type":"container","Action":"destroy","Actor":{"ID":"c1","Attributes":null}}"#;
        let event = parse(no_attributes, Runtime::Podman).unwrap();
        assert_eq!((event.action, event.name.as_str()), (Action::Destroyed, ""));
    }
}
