//! Serves warp routes over HTTP/1 on a dedicated OS thread and runtime, with a header
//! timeout and a connection cap that keeps new requests (the kubelet's) served when a
//! flood of unfinished connections arrives.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use warp::Filter;
use warp::http::{Method, Response};

use super::response::{head_without_body, not_found};
use crate::block_on::block_on;

/// Errors of starting an HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be bound (taken, or not ours).
    #[error("failed to bind {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The OS refused the server its thread or runtime.
    #[error("failed to start the {name} server thread")]
    Start {
        /// The server's name.
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One request, as the routes' tests and fuzzing make it (see each router's `respond`).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub struct Request<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path, without the query.
    pub path: &'a str,
    /// The raw query string, without `?` ("" when there is none).
    pub query: &'a str,
    /// The peer's address: who is asking.
    pub peer: SocketAddr,
}

/// Who is asking: the connection loop puts the peer's address in every request's
/// extensions, where routes read it with `warp::ext`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// The response `routes` give `request`, without a socket: how the routes of every
/// server here are tested and fuzzed. A path and query that do not make a request
/// target (hyper would have refused the request) get the 404 of an unknown path.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub(crate) fn answer<R>(routes: R, request: &Request<'_>) -> Response<String>
where
    R: Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync,
{
    let target = if request.query.is_empty() {
        request.path.to_owned()
    } else {
        format!("{}?{}", request.path, request.query)
    };
    let uri = match target.parse::<warp::http::Uri>() {
        Ok(uri)
            if uri.scheme().is_none()
                && uri.path() == request.path
                && uri.query().unwrap_or_default() == request.query =>
        {
            uri
        }
        _ => return head_without_body(request.method, not_found()),
    };
    let mut http_request = warp::http::Request::new(String::new());
    *http_request.method_mut() = request.method.clone();
    *http_request.uri_mut() = uri;
    http_request.extensions_mut().insert(Peer(request.peer));
    // The routes never wait on anything (every filter of theirs is ready at once): this
    // returns at the first poll.
    let Ok(response) = block_on(tower_service::Service::call(
        &mut warp::service(routes),
        http_request,
    ));
    let (parts, body) = response.into_parts();
    // A body made from a String cannot fail.
    let body = block_on(body.collect()).map_or_else(
        |_| String::new(),
        |body| String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    );
    Response::from_parts(parts, body)
}

/// How much a server lets its clients hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A connection that has not sent a whole request head this long after it opened,
    /// or after its previous response, is closed.
    pub header_timeout: Duration,
    /// Open connections at most; a new one past the cap closes the oldest, so that a
    /// flood of stalled connections cannot lock the kubelet out.
    pub max_connections: usize,
}

impl Default for Limits {
    /// A 5 second header timeout (the kubelet's whole probe timeout is 1 second by
    /// default) and 256 connections (a probe server sees a handful).
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            max_connections: 256,
        }
    }
}

/// Pending connections the kernel queues before `accept`.
const BACKLOG: u32 = 1024;

/// At most one connection-cap warning per this period; the next one counts the rest.
const CAP_LOG_PERIOD: Duration = Duration::from_secs(10);

/// An HTTP server on its own thread with its own current-thread runtime. Dropping it
/// shuts the server down and waits for its thread.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `addr` now, so a taken port is an error here rather than a panic later,
    /// then serves `routes` on a new thread called `name`, with the default [`Limits`].
    /// Every request carries its [`Peer`] in its extensions. The routes cannot reject
    /// (`Error = Infallible`): each request gets their answer, never a default of warp's.
    pub fn spawn<R>(name: &str, addr: SocketAddr, routes: R) -> Result<Self, Error>
    where
        R: Filter<Extract = (Response<String>,), Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
    {
        Self::spawn_with_limits(name, addr, routes, Limits::default())
    }

    /// [`HttpServer::spawn`] with `limits`.
    pub fn spawn_with_limits<R>(
        name: &str,
        addr: SocketAddr,
        routes: R,
        limits: Limits,
    ) -> Result<Self, Error>
    where
        R: Filter<Extract = (Response<String>,), Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
    {
        let start = |source| Error::Start {
            name: name.to_owned(),
            source,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(start)?;
        let listener = {
            // The listener registers with the runtime it is made in.
            let _entered = runtime.enter();
            bind(addr).map_err(|source| Error::Bind { addr, source })?
        };
        let local_addr = listener.local_addr().map_err(start)?;
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let server = Server {
            name: name.to_owned(),
            routes,
            limits,
        };
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || runtime.block_on(server.serve(listener, shutdown_rx)))
            .map_err(start)?;
        Ok(Self {
            local_addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the real port when 0 was asked for).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// What the server thread runs.
struct Server<R> {
    name: String,
    routes: R,
    limits: Limits,
}

/// The open connections, oldest first (ids grow), each with its way to close it.
type Open = Arc<Mutex<BTreeMap<u64, CancellationToken>>>;

impl<R> Server<R>
where
    R: Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    /// Accepts until `shutdown` fires.
    async fn serve(self, listener: TcpListener, shutdown: oneshot::Receiver<()>) {
        // Not a graceful shutdown: it would wait for every open connection, and a client
        // that stalls mid-request would hold the process open. Returning drops the
        // runtime, which closes the connections.
        tokio::select! {
            () = self.accept_loop(listener) => {}
            _ = shutdown => {}
        }
    }

    async fn accept_loop(&self, listener: TcpListener) {
        let open: Open = Arc::default();
        let mut next_id = 0_u64;
        let mut cap_log = CapLog::default();
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, or the peer gave up before the accept: back
                    // off a little rather than spin.
                    tracing::warn!(server = %self.name, %error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let evicted = {
                let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
                let mut evicted = 0;
                while open.len() >= self.limits.max_connections.max(1) {
                    if let Some((_, oldest)) = open.pop_first() {
                        oldest.cancel();
                        evicted += 1;
                    }
                }
                evicted
            };
            if evicted > 0 {
                cap_log.evicted(&self.name, self.limits.max_connections, evicted);
            }
            let token = CancellationToken::new();
            let id = next_id;
            next_id += 1;
            open.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id, token.clone());
            tokio::spawn(serve_connection(
                stream,
                peer,
                self.routes.clone(),
                self.limits.header_timeout,
                token,
                Connection {
                    open: Arc::clone(&open),
                    id,
                },
            ));
        }
    }
}

/// Forgets its connection when the connection's task ends, however it ends.
struct Connection {
    open: Open,
    id: u64,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

async fn serve_connection<R>(
    stream: TcpStream,
    peer: SocketAddr,
    routes: R,
    header_timeout: Duration,
    closed: CancellationToken,
    _connection: Connection,
) where
    R: Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    let routes = warp::service(routes);
    let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(Peer(peer));
        // warp's service is always ready: no `poll_ready` to wait for.
        tower_service::Service::call(&mut routes.clone(), request)
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        // A client that sends garbage or times out ends here; nothing to report.
        _ = connection => {}
        () = closed.cancelled() => {}
    }
}

/// Rate-limits the connection-cap warning so that a flood cannot flood the log too.
#[derive(Default)]
struct CapLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl CapLog {
    fn evicted(&mut self, server: &str, cap: usize, evicted: u64) {
        self.unlogged += evicted;
        let now = Instant::now();
        if self.last.is_some_and(|last| now - last < CAP_LOG_PERIOD) {
            return;
        }
        tracing::warn!(
            server,
            cap,
            closed = self.unlogged,
            "connection cap reached: closing the oldest connections to keep answering new ones"
        );
        self.last = Some(now);
        self.unlogged = 0;
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    fn echo_peer()
    -> impl Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync + 'static
    {
        warp::path::full().and(warp::ext::optional::<Peer>()).map(
            |path: warp::path::FullPath, peer: Option<Peer>| {
                let peer = peer.map_or_else(|| "no peer".to_owned(), |Peer(p)| p.ip().to_string());
                Response::new(format!("{} {peer}", path.as_str()))
            },
        )
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        request(addr, "GET", path)
    }

    /// The whole response to `method path`, head and body.
    fn request(addr: SocketAddr, method: &str, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    /// `server`'s routes answer an unknown path 404 and a POST to `path` 405, in the
    /// words and headers of kube-apiserver, over a socket.
    fn assert_404_and_405(server: &HttpServer, path: &str) {
        let addr = server.local_addr();
        let response = request(addr, "GET", "/nowhere");
        assert!(
            response.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{response}"
        );
        assert!(
            response.contains("\r\ncontent-type: text/plain; charset=utf-8\r\n"),
            "{response}"
        );
        assert!(
            response.ends_with("\r\n\r\n404 page not found\n"),
            "{response}"
        );
        let response = request(addr, "POST", path);
        assert!(
            response.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{response}"
        );
        assert!(response.contains("\r\nallow: GET, HEAD\r\n"), "{response}");
        assert!(
            response.ends_with("\r\n\r\nmethod not allowed\n"),
            "{response}"
        );
    }

    #[test]
    fn the_probe_routes_answer_404_and_405_and_see_the_peer() {
        let health = Arc::new(crate::health::Health::new());
        health
            .liveness
            .add(Arc::new(crate::health::FnCheck::new("reconcilers", || {
                Err("web default/site running 9s".into())
            })));
        let probes = super::super::Probes::new(health);
        let server =
            HttpServer::spawn("probe", "127.0.0.1:0".parse().unwrap(), probes.routes()).unwrap();
        assert_404_and_405(&server, "/healthz");
        // The peer reached the routes: a loopback peer reads the reason.
        let response = get(server.local_addr(), "/healthz/reconcilers");
        assert!(response.starts_with("HTTP/1.1 500"), "{response}");
        assert!(
            response.ends_with("web default/site running 9s\n"),
            "{response}"
        );
    }

    #[test]
    fn the_debug_routes_answer_404_and_405() {
        let views =
            super::super::DebugViews::new(crate::guard::Registry::new(Duration::from_secs(1)));
        let server =
            HttpServer::spawn("debug", "127.0.0.1:0".parse().unwrap(), views.routes()).unwrap();
        assert_404_and_405(&server, "/debug/reconciles");
        let response = get(server.local_addr(), "/debug/reconciles");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("[]"), "{response}");
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn the_metrics_routes_answer_404_and_405() {
        let metrics = crate::metrics::Metrics::new(Arc::new(crate::health::Health::new()));
        let routes = crate::metrics::routes(move || metrics.encode());
        let server = HttpServer::spawn("metrics", "127.0.0.1:0".parse().unwrap(), routes).unwrap();
        assert_404_and_405(&server, "/metrics");
        let response = get(server.local_addr(), "/metrics");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("# EOF\n"), "{response}");
    }

    /// Whether the server closed `stream` within `within`.
    fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        stream.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0_u8; 512];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn a_taken_port_is_an_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = HttpServer::spawn("probe", addr, echo_peer()).unwrap_err();
        assert_eq!(err.to_string(), format!("failed to bind {addr}"));
    }

    #[test]
    fn the_routes_see_path_and_peer() {
        let server =
            HttpServer::spawn("probe", "127.0.0.1:0".parse().unwrap(), echo_peer()).unwrap();
        let response = get(server.local_addr(), "/healthz?verbose");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("/healthz 127.0.0.1"), "{response}");
    }

    #[test]
    fn a_client_stalled_mid_request_does_not_hold_shutdown() {
        let server =
            HttpServer::spawn("probe", "127.0.0.1:0".parse().unwrap(), echo_peer()).unwrap();
        let mut stalled = TcpStream::connect(server.local_addr()).unwrap();
        stalled.write_all(b"GET /heal").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(server);
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "dropping the server hung on a stalled client"
        );
    }

    #[test]
    fn unfinished_and_idle_connections_are_closed_after_the_header_timeout() {
        let limits = Limits {
            header_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let server = HttpServer::spawn_with_limits(
            "probe",
            "127.0.0.1:0".parse().unwrap(),
            echo_peer(),
            limits,
        )
        .unwrap();
        let mut unfinished = TcpStream::connect(server.local_addr()).unwrap();
        unfinished
            .write_all(b"GET /healthz HTTP/1.1\r\nHo")
            .unwrap();
        let mut silent = TcpStream::connect(server.local_addr()).unwrap();
        // Kept alive after one answer, then idle.
        let mut idle = TcpStream::connect(server.local_addr()).unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        assert!(closed_within(&mut unfinished, Duration::from_secs(10)));
        assert!(closed_within(&mut silent, Duration::from_secs(10)));
        assert!(closed_within(&mut idle, Duration::from_secs(10)));
    }

    #[test]
    fn past_the_cap_the_oldest_connection_makes_room() {
        let limits = Limits {
            max_connections: 4,
            ..Limits::default()
        };
        let server = HttpServer::spawn_with_limits(
            "probe",
            "127.0.0.1:0".parse().unwrap(),
            echo_peer(),
            limits,
        )
        .unwrap();
        let mut stalled: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut s = TcpStream::connect(server.local_addr()).unwrap();
                s.write_all(b"GET /heal").unwrap();
                s
            })
            .collect();
        assert!(get(server.local_addr(), "/healthz").starts_with("HTTP/1.1 200"));
        // The first ones were closed to make room; the last ones are still open.
        assert!(closed_within(&mut stalled[0], Duration::from_secs(10)));
        assert!(!closed_within(
            stalled.last_mut().unwrap(),
            Duration::from_millis(100)
        ));
    }
}
