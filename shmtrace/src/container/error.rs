//! Why a container could not be resolved. Each message says what is wrong and what to do.
use std::{fmt, time::Duration};

use super::{Container, endpoints::RuntimeProblem};

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("{}", not_found(.query, .running, .asked, .problems, *.fallback))]
    NotFound {
        /// What was asked for, escaped (`container named "trainer"`).
        query: String,
        /// Display names of the running containers, for the user to pick from.
        running: Vec<String>,
        /// The sockets that answered (`docker at /var/run/docker.sock`).
        asked: Vec<String>,
        /// Runtimes that did not answer.
        problems: Vec<RuntimeProblem>,
        /// Whether the cgroup scan was used (it knows ids, not names).
        fallback: bool,
    },
    #[error(
        "{query} matches several containers: {}; give a longer id prefix, or --pod/--namespace \
         for Kubernetes containers",
        .matches.join(", ")
    )]
    Ambiguous { query: String, matches: Vec<String> },
    #[error(
        "container {} ({} {}) is {}: there is nothing to trace until it runs; start it \
         ({}) or pass --wait to wait for it",
        .container.display_name(), .container.runtime, .container.short_id(), .container.state,
        start_command(.container)
    )]
    NotRunning { container: Box<Container> },
    #[error(
        "{query} did not start within {}s{}; check it with `docker ps -a` (or your runtime's \
         equivalent)",
        .waited.as_secs(), last_seen(.last)
    )]
    WaitTimedOut {
        query: String,
        waited: Duration,
        /// The error that was still true at the end (not found, not running).
        last: Option<Box<ContainerError>>,
    },
    #[error("{query}: {reason}")]
    Describe { query: String, reason: String },
    #[error("no container given: name one (--container NAME) or give its id (--container-id ID)")]
    EmptyQuery,
}

impl ContainerError {
    /// Whether waiting could make it go away (the container may yet appear or start, or the
    /// runtime that listed it may answer its inspection next time: a busy Docker daemon can
    /// take more than its timeout to describe a container that is starting).
    pub fn may_resolve_later(&self) -> bool {
        matches!(
            self,
            ContainerError::NotFound { .. }
                | ContainerError::NotRunning { .. }
                | ContainerError::Describe { .. }
        )
    }
}

fn not_found(
    query: &str,
    running: &[String],
    asked: &[String],
    problems: &[RuntimeProblem],
    fallback: bool,
) -> String {
    let mut text = format!("no {query}");
    if !asked.is_empty() {
        text.push_str(&format!(" (asked {})", asked.join(", ")));
    }
    text.push('.');
    for problem in problems {
        text.push_str(&format!(" {problem}."));
    }
    if fallback {
        text.push_str(
            " No runtime answered, so shmtrace scanned /proc/*/cgroup, which shows container \
             ids but not names: give an id with --container-id.",
        );
    }
    // Enough to spot a typo; a Kubernetes node may run hundreds.
    const SHOWN: usize = 30;
    match running.len() {
        0 => text.push_str(" No container is running."),
        n if n <= SHOWN => text.push_str(&format!(" Running containers: {}.", running.join(", "))),
        n => text.push_str(&format!(
            " Running containers: {}, and {} more.",
            running[..SHOWN].join(", "),
            n - SHOWN
        )),
    }
    text
}

fn last_seen(last: &Option<Box<ContainerError>>) -> String {
    match last.as_deref() {
        Some(ContainerError::NotRunning { container }) => {
            format!(" (it is {})", container.state)
        }
        Some(ContainerError::NotFound { .. }) => " (no such container appeared)".into(),
        _ => String::new(),
    }
}

fn start_command(container: &Container) -> String {
    use super::Runtime;
    // What `docker start` takes: the bare name or id, without pod and namespace.
    let name = shmtrace_core::model::container_label(&container.name, &container.id, None, None);
    match container.runtime {
        Runtime::Docker => format!("docker start {name}"),
        Runtime::Podman => format!("podman start {name}"),
        _ => "Kubernetes restarts it by its restart policy".into(),
    }
}

/// `container named "trainer"`, `container with id starting "3f4e"`, with pod and namespace.
pub(super) struct QueryText<'a>(pub &'a super::Query);

impl fmt::Display for QueryText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let esc = shmtrace_core::event::escape::text;
        let query = self.0;
        match (&query.name, &query.id) {
            (Some(name), _) => write!(f, "container named \"{}\"", esc(name))?,
            (None, Some(id)) => write!(f, "container with id starting \"{}\"", esc(id))?,
            (None, None) => write!(f, "container")?,
        }
        if let Some(pod) = &query.pod {
            write!(f, " in pod \"{}\"", esc(pod))?;
        }
        if let Some(namespace) = &query.namespace {
            write!(f, " in namespace \"{}\"", esc(namespace))?;
        }
        Ok(())
    }
}
