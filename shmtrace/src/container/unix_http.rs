//! HTTP/1.1 requests over a unix socket: what the Docker and Podman APIs speak.
//!
//! hyper's low-level client connection (one connection per request) is all this needs: no pool,
//! no TLS, no DNS. Every request has a deadline, so a daemon that accepts and never answers
//! cannot hang shmtrace.
use std::{io, path::Path, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode, body::Bytes, body::Incoming, client::conn::http1};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    #[error("the daemon broke the connection: {0}")]
    Protocol(#[source] hyper::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("bad request URI {0:?}")]
    Uri(String),
}

impl HttpError {
    /// Whether the socket refused us for lack of permission.
    pub fn is_denied(&self) -> bool {
        matches!(self, HttpError::Connect(e) if e.kind() == io::ErrorKind::PermissionDenied)
    }

    /// Whether the daemon is simply not there (no socket, or nobody listening on it).
    pub fn is_not_listening(&self) -> bool {
        matches!(self, HttpError::Connect(e)
            if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused))
    }
}

/// A response whose body has been read in full.
pub struct Response {
    pub status: StatusCode,
    pub body: Bytes,
}

/// `GET path_and_query` on the HTTP server at `socket`, body read in full.
pub async fn get(socket: &Path, path: &str, timeout: Duration) -> Result<Response, HttpError> {
    tokio::time::timeout(timeout, async {
        let response = send(socket, path).await?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(HttpError::Protocol)?
            .to_bytes();
        Ok(Response { status, body })
    })
    .await
    .map_err(|_| HttpError::Timeout(timeout))?
}

/// `GET path_and_query` whose body goes on for as long as the server likes (Docker's
/// `/events`): the connection must be made and answered within `timeout`; the body is read
/// by the caller, frame by frame.
pub async fn stream(
    socket: &Path,
    path: &str,
    timeout: Duration,
) -> Result<(StatusCode, Incoming), HttpError> {
    let response = tokio::time::timeout(timeout, send(socket, path))
        .await
        .map_err(|_| HttpError::Timeout(timeout))??;
    let status = response.status();
    Ok((status, response.into_body()))
}

async fn send(socket: &Path, path: &str) -> Result<hyper::Response<Incoming>, HttpError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(HttpError::Connect)?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(HttpError::Protocol)?;
    // The connection task ends when the response body is read or dropped.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = Request::get(path)
        // HTTP/1.1 needs a Host; the daemon ignores it on a unix socket.
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|_| HttpError::Uri(path.to_owned()))?;
    sender
        .send_request(request)
        .await
        .map_err(HttpError::Protocol)
}
