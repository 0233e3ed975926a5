//! Finding a container by name or id across every runtime that answers, with the cgroup scan
//! as the fallback; waiting for one to start; noticing that a name now points elsewhere.
use std::{path::PathBuf, time::Duration};

use super::{
    Container, ContainerError, FoundBy, Runtime,
    client::{Candidate, RuntimeClient, id_label},
    cri::{self, CriClient},
    docker::{self, DockerClient},
    endpoints::{self, Api, Endpoint, ProblemKind, RuntimeProblem},
    error::QueryText,
    host::{self, HostFacts},
    scan,
};

/// What to look for. Give a name or an id prefix; `pod` and `namespace` narrow Kubernetes
/// containers (whose names repeat across pods).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// Exact container name (Docker's without the leading `/`; Kubernetes' name in the pod).
    pub name: Option<String>,
    /// Id or id prefix (`--container-id`).
    pub id: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
}

impl Query {
    pub fn name(name: impl Into<String>) -> Query {
        Query {
            name: Some(name.into()),
            ..Query::default()
        }
    }

    pub fn id(id: impl Into<String>) -> Query {
        Query {
            id: Some(id.into()),
            ..Query::default()
        }
    }

    fn matches(&self, candidate: &Candidate) -> bool {
        let name_ok = match &self.name {
            Some(name) => !candidate.name.is_empty() && candidate.name == *name,
            None => true,
        };
        let id_ok = match &self.id {
            Some(prefix) => !prefix.is_empty() && candidate.id.starts_with(&prefix.to_lowercase()),
            None => true,
        };
        let pod_ok = self.pod.is_none() || self.pod == candidate.pod;
        let ns_ok = self.namespace.is_none() || self.namespace == candidate.namespace;
        name_ok && id_ok && pod_ok && ns_ok
    }
}

/// A container found, with what the lookup learned on the way.
#[derive(Clone, Debug)]
pub struct Resolution {
    pub container: Container,
    /// Runtimes that did not answer: worth a warning even when the container was found.
    pub problems: Vec<RuntimeProblem>,
    /// The container was found by the cgroup scan (no runtime answered for it): say so.
    pub fallback: bool,
}

/// What became of a container since it was resolved.
#[derive(Clone, Debug)]
pub enum Change {
    /// Same container, same main process.
    Unchanged,
    /// Running again with another main process (`docker restart`), or the name now belongs to
    /// a new container (`docker rm -f` then `docker run --name` again): `same_id` tells which.
    /// Trace the new one's mount namespace.
    Restarted {
        container: Box<Container>,
        same_id: bool,
    },
    /// It exists but is not running.
    Stopped { container: Box<Container> },
    /// No container answers to that name or id any more.
    Gone,
}

/// Everything every runtime said, once.
struct Survey {
    sources: Vec<(Endpoint, Box<dyn RuntimeClient>, Vec<Candidate>)>,
    problems: Vec<RuntimeProblem>,
    /// Containers found by the cgroup scan that no answering runtime knows.
    scanned: Vec<Container>,
    /// Whether the scan ran because some runtime did not answer.
    fallback: bool,
}

/// Looks containers up in every runtime it can reach.
#[derive(Clone, Debug)]
pub struct Resolver {
    endpoints: Vec<Endpoint>,
    /// Sockets the user named: a missing one is reported, where a missing default is just a
    /// runtime that is not installed.
    explicit: Vec<PathBuf>,
    timeout: Duration,
    poll: Duration,
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::new()
    }
}

impl Resolver {
    /// Tries every runtime's usual socket (see [`endpoints::defaults`]).
    pub fn new() -> Resolver {
        let mut resolver = Resolver::with_endpoints(endpoints::defaults());
        resolver.explicit.clear();
        resolver
    }

    /// Tries exactly these sockets.
    pub fn with_endpoints(endpoints: Vec<Endpoint>) -> Resolver {
        let endpoints = endpoints::dedup(endpoints);
        Resolver {
            explicit: endpoints.iter().map(|e| e.socket.clone()).collect(),
            endpoints,
            timeout: Duration::from_secs(5),
            poll: Duration::from_millis(200),
        }
    }

    /// Uses `socket` for Docker instead of the usual paths (`--docker-socket`).
    pub fn docker_socket(mut self, socket: impl Into<PathBuf>) -> Resolver {
        let socket = socket.into();
        self.endpoints.retain(|e| e.runtime != Runtime::Docker);
        self.endpoints.insert(0, Endpoint::docker(socket.clone()));
        self.explicit.push(socket);
        self
    }

    /// Asks the CRI runtime (containerd, CRI-O) at `socket` too, first.
    pub fn cri_socket(mut self, socket: impl Into<PathBuf>) -> Resolver {
        let socket = socket.into();
        self.endpoints
            .insert(0, Endpoint::containerd(socket.clone()));
        self.endpoints = endpoints::dedup(self.endpoints);
        self.explicit.push(socket);
        self
    }

    /// The one container `query` names, running, with its /dev/shm measured.
    ///
    /// Errors: [`ContainerError::NotFound`] (listing the running containers),
    /// [`ContainerError::Ambiguous`], [`ContainerError::NotRunning`].
    pub async fn resolve(&self, query: &Query) -> Result<Resolution, ContainerError> {
        if query.name.as_deref().is_none_or(str::is_empty)
            && query.id.as_deref().is_none_or(str::is_empty)
        {
            return Err(ContainerError::EmptyQuery);
        }
        let mut survey = self.survey().await;
        let host = HostFacts::read();
        let query_text = QueryText(query).to_string();

        let mut matches: Vec<(usize, Candidate)> = survey
            .sources
            .iter()
            .enumerate()
            .flat_map(|(i, (_, _, candidates))| {
                candidates
                    .iter()
                    .filter(|c| query.matches(c))
                    .map(move |c| (i, c.clone()))
            })
            .collect();
        let scanned: Vec<Container> = survey
            .scanned
            .iter()
            .filter(|c| query.matches(&candidate_of(c)))
            .cloned()
            .collect();

        // A name may be carried by several containers (one per runtime, or per pod): a running
        // one wins over stopped ones, but two running ones need the user to choose. An id
        // prefix that fits several containers is ambiguous whatever their state.
        let running = matches.iter().filter(|(_, c)| c.state.is_running()).count() + scanned.len();
        let total = matches.len() + scanned.len();
        let ambiguous = if query.id.is_some() {
            total > 1
        } else {
            running > 1 || (running == 0 && total > 1)
        };
        if ambiguous {
            let mut names: Vec<String> = matches
                .iter()
                .map(|(_, c)| {
                    format!(
                        "{} ({}, {})",
                        c.display_name(),
                        id_label(c.runtime, &c.id),
                        c.state
                    )
                })
                .chain(scanned.iter().map(|c| id_label(c.runtime, &c.id)))
                .collect();
            names.sort();
            return Err(ContainerError::Ambiguous {
                query: query_text,
                matches: names,
            });
        }
        if running == 1 {
            matches.retain(|(_, c)| c.state.is_running());
        }

        if let Some((source, candidate)) = matches.into_iter().next() {
            let (_, source, _) = &mut survey.sources[source];
            let mut container = source
                .describe(&candidate.id)
                .await
                .map_err(|reason| ContainerError::Describe {
                    query: query_text.clone(),
                    reason,
                })?
                .ok_or_else(|| ContainerError::Describe {
                    query: query_text.clone(),
                    reason: "it was removed while shmtrace looked it up".into(),
                })?;
            host::enrich(&mut container, &host);
            if !container.state.is_running() {
                return Err(ContainerError::NotRunning {
                    container: Box::new(container),
                });
            }
            return Ok(Resolution {
                container,
                problems: survey.problems,
                fallback: false,
            });
        }
        if let Some(mut container) = scanned.into_iter().next() {
            host::enrich(&mut container, &host);
            return Ok(Resolution {
                container,
                problems: survey.problems,
                fallback: true,
            });
        }
        Err(not_found(query_text, &survey))
    }

    /// Like [`Resolver::resolve`], but a container that does not exist yet or is not running
    /// is waited for, up to `timeout` (`--wait`). Polls every 200 ms.
    pub async fn wait_until_running(
        &self,
        query: &Query,
        timeout: Duration,
    ) -> Result<Resolution, ContainerError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.resolve(query).await {
                Err(error) if error.may_resolve_later() => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(ContainerError::WaitTimedOut {
                            query: QueryText(query).to_string(),
                            waited: timeout,
                            last: Some(Box::new(error)),
                        });
                    }
                    tokio::time::sleep(self.poll).await;
                }
                other => return other,
            }
        }
    }

    /// What became of `previous` (found earlier by [`Resolver::resolve`]): looked up again by
    /// name where it has one (so a container re-created under the same name is followed), else
    /// by id. Poll it, for example once a second, or when the traced processes all exit.
    pub async fn recheck(&self, previous: &Container) -> Result<Change, ContainerError> {
        let query = if previous.name.is_empty() || previous.found_by == FoundBy::CgroupScan {
            Query::id(previous.id.clone())
        } else {
            Query {
                name: Some(previous.name.clone()),
                pod: previous.pod.clone(),
                namespace: previous.namespace.clone(),
                id: None,
            }
        };
        match self.resolve(&query).await {
            Ok(found) => {
                let container = found.container;
                if container.id == previous.id && container.pid == previous.pid {
                    Ok(Change::Unchanged)
                } else {
                    Ok(Change::Restarted {
                        same_id: container.id == previous.id,
                        container: Box::new(container),
                    })
                }
            }
            Err(ContainerError::NotRunning { container }) => Ok(Change::Stopped { container }),
            Err(ContainerError::NotFound { .. }) => Ok(Change::Gone),
            Err(error) => Err(error),
        }
    }

    /// Every running container, described and measured: what `--all` labels events with.
    /// Sandboxes (pause) are left out.
    pub async fn running(&self) -> (Vec<Container>, Vec<RuntimeProblem>) {
        let (running, _, problems) = self.running_and_stopped().await;
        (running, problems)
    }

    /// As [`Resolver::running`], and the containers the runtimes list that do not run (as
    /// the list shows them: no process, no /dev/shm), so that one that stopped before it was
    /// seen running can still be named.
    pub async fn running_and_stopped(
        &self,
    ) -> (Vec<Container>, Vec<Candidate>, Vec<RuntimeProblem>) {
        let mut survey = self.survey().await;
        let host = HostFacts::read();
        let mut found = Vec::new();
        let mut stopped = Vec::new();
        for (_, source, candidates) in &mut survey.sources {
            stopped.extend(candidates.iter().filter(|c| !c.state.is_running()).cloned());
            for candidate in candidates.iter().filter(|c| c.state.is_running()) {
                if let Ok(Some(mut container)) = source.describe(&candidate.id).await {
                    host::enrich(&mut container, &host);
                    found.push(container);
                }
            }
        }
        for mut container in survey.scanned {
            host::enrich(&mut container, &host);
            found.push(container);
        }
        (found, stopped, survey.problems)
    }

    /// The sockets that speak the Docker Engine API (Docker, Podman) and exist now: those
    /// whose event streams name containers as they start.
    pub fn event_sockets(&self) -> Vec<(Runtime, PathBuf)> {
        self.endpoints
            .iter()
            .filter(|e| e.api == Api::Docker && e.socket.exists())
            .map(|e| (e.runtime, e.socket.clone()))
            .collect()
    }

    /// The container with this full id, described by the runtime `runtime` that runs it (or
    /// by any runtime that answers, for [`Runtime::Unknown`]), with what /proc adds if it
    /// runs; `None` when no runtime knows it.
    pub async fn describe_id(&self, runtime: Runtime, id: &str) -> Option<Container> {
        let host = HostFacts::read();
        for endpoint in &self.endpoints {
            let wanted = runtime == Runtime::Unknown
                || endpoint.runtime == runtime
                // Podman behind Docker's socket, CRI-O on containerd's path.
                || endpoint.api == api_of(runtime);
            if !wanted || !endpoint.socket.exists() {
                continue;
            }
            let Ok(mut client) = self.client(endpoint).await else {
                continue;
            };
            if let Ok(Some(mut container)) = client.describe(id).await {
                host::enrich(&mut container, &host);
                return Some(container);
            }
        }
        None
    }

    /// Asks every runtime for its containers; scans /proc when one could not answer.
    async fn survey(&self) -> Survey {
        let mut survey = Survey {
            sources: Vec::new(),
            problems: Vec::new(),
            scanned: Vec::new(),
            fallback: false,
        };
        for endpoint in &self.endpoints {
            if !endpoint.socket.exists() {
                if self.explicit.contains(&endpoint.socket) {
                    survey.problems.push(RuntimeProblem {
                        runtime: endpoint.runtime,
                        socket: endpoint.socket.clone(),
                        kind: ProblemKind::Down {
                            reason: "no such socket".into(),
                        },
                    });
                }
                continue;
            }
            match self.connect(endpoint).await {
                Ok((source, candidates)) => {
                    survey.sources.push((endpoint.clone(), source, candidates))
                }
                Err(kind) => survey.problems.push(RuntimeProblem {
                    runtime: endpoint.runtime,
                    socket: endpoint.socket.clone(),
                    kind,
                }),
            }
        }
        let hidden = survey.problems.iter().any(RuntimeProblem::hides_containers);
        if hidden || survey.sources.is_empty() {
            survey.fallback = true;
            let known: Vec<&str> = survey
                .sources
                .iter()
                .flat_map(|(_, _, c)| c.iter().map(|c| c.id.as_str()))
                .collect();
            survey.scanned = scan::containers(&scan::read_proc())
                .into_iter()
                .filter(|c| !known.contains(&c.id.as_str()))
                .collect();
        }
        survey
    }

    async fn connect(
        &self,
        endpoint: &Endpoint,
    ) -> Result<(Box<dyn RuntimeClient>, Vec<Candidate>), ProblemKind> {
        let mut client = self.client(endpoint).await?;
        let candidates = client.candidates().await?;
        Ok((client, candidates))
    }

    async fn client(&self, endpoint: &Endpoint) -> Result<Box<dyn RuntimeClient>, ProblemKind> {
        Ok(match endpoint.api {
            Api::Docker => Box::new(
                DockerClient::connect(&endpoint.socket, endpoint.runtime, self.timeout)
                    .await
                    .map_err(docker::problem)?,
            ),
            Api::Cri => Box::new(
                CriClient::connect(&endpoint.socket, endpoint.runtime, self.timeout)
                    .await
                    .map_err(cri::problem)?,
            ),
        })
    }
}

/// The API a runtime speaks.
fn api_of(runtime: Runtime) -> Api {
    match runtime {
        Runtime::Docker | Runtime::Podman => Api::Docker,
        Runtime::Containerd | Runtime::CriO | Runtime::Unknown => Api::Cri,
    }
}

/// A scanned container as a list row, so the same query matching applies.
fn candidate_of(container: &Container) -> Candidate {
    Candidate {
        runtime: container.runtime,
        id: container.id.clone(),
        name: container.name.clone(),
        pod: container.pod.clone(),
        namespace: container.namespace.clone(),
        state: container.state.clone(),
    }
}

fn not_found(query: String, survey: &Survey) -> ContainerError {
    let mut running: Vec<String> = survey
        .sources
        .iter()
        .flat_map(|(_, _, candidates)| candidates.iter())
        .filter(|c| c.state.is_running())
        .map(Candidate::display_name)
        .chain(survey.scanned.iter().map(|c| id_label(c.runtime, &c.id)))
        .collect();
    running.sort();
    ContainerError::NotFound {
        query,
        running,
        asked: survey
            .sources
            .iter()
            .map(|(endpoint, source, _)| {
                format!("{} at {}", source.runtime(), endpoint.socket.display())
            })
            .collect(),
        problems: survey
            .problems
            .iter()
            .filter(|p| p.hides_containers())
            .cloned()
            .collect(),
        fallback: survey.fallback && survey.sources.is_empty(),
    }
}
