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

use super::metrics::{Format, encode};

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

/// Binds `addr` now (so that a port in use is an error at start), and serves from a task.
/// Returns the address bound: with port 0, the port the kernel chose.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    heartbeat: Heartbeat,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} (is another daemon running? choose another --listen)")
    })?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the address bound for {addr}"))?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, say: wait, do not spin.
                    log::warn!("accepting a metrics connection: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let registry = registry.clone();
            let heartbeat = heartbeat.clone();
            tokio::spawn(async move {
                let handler = service::service_fn(move |request| {
                    let response = respond(&request, &registry, &heartbeat);
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), handler);
                if let Err(error) = connection.await {
                    log::debug!("metrics connection: {error}");
                }
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
            let format = Format::negotiate(accept);
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
