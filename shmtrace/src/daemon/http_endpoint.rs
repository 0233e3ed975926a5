//! The daemon's HTTP endpoint: `/metrics` for Prometheus, `/healthz` for the kubelet's probe.
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, header, server::conn::http1, service};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::{
    connections::{Admission, Connections},
    metrics::{ExpositionFormat, KindLabels, Metrics, encode},
};

/// The main loop is unhealthy when it has not run for this long (it runs every 100 ms).
const STALL: Duration = Duration::from_secs(10);

/// When the main loop last ran, in seconds since the epoch: `/healthz` reads it.
#[derive(Clone, Default)]
pub struct Heartbeat(Arc<AtomicU64>);

impl Heartbeat {
    pub fn beat(&self) {
        self.0.store(now_secs(), Ordering::Relaxed);
    }

    fn age(&self) -> Duration {
        Duration::from_secs(now_secs().saturating_sub(self.0.load(Ordering::Relaxed)))
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Connections accepted in a row before the connection tasks get the thread.
const ACCEPTS_BEFORE_YIELD: u32 = 16;

/// Longest a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr` now (so that a port in use is an error at start), and serves from a task, at
/// most as many connections at once as `connections` has slots (see `connections`). Returns the address
/// bound: with port 0, the port the kernel chose.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    metrics: Metrics,
    heartbeat: Heartbeat,
    connections: Arc<Connections>,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} (is another daemon running? choose another --listen)")
    })?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the address bound for {addr}"))?;
    let shed = |kind: &str| {
        metrics
            .http_connections_shed
            .get_or_create(&KindLabels { kind: kind.into() })
            .clone()
    };
    // Every kind's counter exists from the start, so that the first is an increase.
    let (at_capacity, idle_evicted) = (shed("at_capacity"), shed("idle_evicted"));
    let open = metrics.http_connections.clone();
    tokio::spawn(async move {
        let mut accepted: u32 = 0;
        loop {
            // A flood keeps the listener ready: let the connections just admitted read their
            // requests before more are accepted that could take their slots.
            accepted = accepted.wrapping_add(1);
            if accepted.is_multiple_of(ACCEPTS_BEFORE_YIELD) {
                tokio::task::yield_now().await;
            }
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, say: wait, do not spin.
                    log::warn!("accepting a metrics connection: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let mut slot = match connections.admit() {
                Admission::Admitted(slot) => slot,
                Admission::Evicted(slot) => {
                    idle_evicted.inc();
                    slot
                }
                Admission::Shed => {
                    // Closed at once: no task, no buffers, its descriptor back now.
                    drop(stream);
                    at_capacity.inc();
                    continue;
                }
            };
            open.set(connections.open() as i64);
            let registry = registry.clone();
            let heartbeat = heartbeat.clone();
            let connections = connections.clone();
            let open = open.clone();
            tokio::spawn(async move {
                let activity = slot.activity();
                let evicted = slot.evicted();
                let handler = service::service_fn(move |request| {
                    activity.serving();
                    let response = respond(&request, &registry, &heartbeat);
                    activity.answered();
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), handler);
                tokio::select! {
                    served = connection => if let Err(error) = served {
                        log::debug!("metrics connection: {error}");
                    },
                    // Its slot went to a newer connection: dropping it closes it.
                    _ = evicted => {}
                }
                drop(slot);
                open.set(connections.open() as i64);
            });
        }
    });
    Ok(bound)
}

fn respond<B>(
    request: &Request<B>,
    registry: &Registry,
    heartbeat: &Heartbeat,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let accept = request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = ExpositionFormat::negotiate(accept);
            Response::builder()
                .header(header::CONTENT_TYPE, format.content_type())
                .body(Full::new(Bytes::from(encode(registry, format))))
                .expect("a valid response")
        }
        "/healthz" => {
            let age = heartbeat.age();
            if age > STALL {
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("stalled: the event loop last ran {}s ago\n", age.as_secs()),
                )
            } else {
                plain(StatusCode::OK, "ok\n".into())
            }
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /healthz\n".into(),
        ),
    }
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response")
}
