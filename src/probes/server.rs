//! Serves a request handler with warp on a dedicated OS thread and runtime.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;
use warp::Filter;
use warp::http::{Method, Response};

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
    /// An address that is neither `host:port` nor `:port`.
    #[error("invalid bind address {0:?}: expected host:port, [ipv6]:port or :port")]
    Address(String),
}

/// Parses a bind address: `host:port`, `[::]:port`, or Go's `:port` (all interfaces).
pub fn parse_bind_address(s: &str) -> Result<SocketAddr, Error> {
    let candidate = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_owned(),
    };
    candidate.parse().map_err(|_| Error::Address(s.to_owned()))
}

/// Answers one request from its method, path and raw query.
pub type Handler = Arc<dyn Fn(&Method, &str, &str) -> Response<String> + Send + Sync>;

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
    /// then serves `handler` on a new thread called `name`.
    pub fn spawn(name: &str, addr: SocketAddr, handler: Handler) -> Result<Self, Error> {
        let listener = TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        let start = |source| Error::Start {
            name: name.to_owned(),
            source,
        };
        listener.set_nonblocking(true).map_err(start)?;
        let local_addr = listener.local_addr().map_err(start)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(start)?;
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();

        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || runtime.block_on(serve(listener, handler, shutdown_rx)))
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

/// Serves `handler` on `listener` until `shutdown` fires.
async fn serve(listener: TcpListener, handler: Handler, shutdown: oneshot::Receiver<()>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "the listener could not join the server's runtime");
            return;
        }
    };
    let routes = warp::method()
        .and(warp::path::full())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .map(
            move |method: Method, path: warp::path::FullPath, query: String| {
                handler(&method, path.as_str(), &query)
            },
        );
    // Not warp's graceful shutdown: it waits for every open connection, and a client
    // that stalls mid-request would hold the process open. Returning drops the runtime,
    // which cancels the connections.
    tokio::select! {
        () = warp::serve(routes).incoming(listener).run() => {}
        _ = shutdown => {}
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
    use super::*;

    #[test]
    fn bind_addresses() {
        assert_eq!(
            parse_bind_address(":8081").unwrap(),
            "0.0.0.0:8081".parse().unwrap()
        );
        assert_eq!(
            parse_bind_address("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(
            parse_bind_address("[::1]:9").unwrap(),
            "[::1]:9".parse().unwrap()
        );
        for bad in ["", ":", "8081", "localhost:80", ":99999", "1.2.3.4"] {
            assert!(parse_bind_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_taken_port_is_an_error_naming_it() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let handler: Handler = Arc::new(|_, _, _| Response::new(String::new()));
        let err = HttpServer::spawn("probe", addr, handler).unwrap_err();
        assert_eq!(err.to_string(), format!("failed to bind {addr}"));
    }

    #[test]
    fn a_client_stalled_mid_request_does_not_hold_shutdown() {
        use std::io::Write;
        let handler: Handler = Arc::new(|_, _, _| Response::new("ok".into()));
        let server = HttpServer::spawn("probe", "127.0.0.1:0".parse().unwrap(), handler).unwrap();
        let mut stalled = std::net::TcpStream::connect(server.local_addr()).unwrap();
        stalled.write_all(b"GET /heal").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(server);
            let _ = done_tx.send(());
        });
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .is_ok(),
            "dropping the server hung on a stalled client"
        );
    }
}
