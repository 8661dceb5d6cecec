//! Floods of unfinished connections on the probe and metrics ports: 3,000 connections
//! whose request headers never end. The servers cap their connections (closing the
//! oldest, with a log line), close unfinished and idle connections after the header
//! timeout, and keep answering new requests. The latency under flood is measured by
//! `benches/load flood` (docs/performance.md), not asserted here.

use crate::support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use support::{Process, eventually, request};

/// Half-open connections per flood.
const HALF_OPEN: usize = 3000;

/// Descriptors this test process needs: the flood, plus room for the rest.
const DESCRIPTORS: u64 = HALF_OPEN as u64 + 512;

/// Raises the soft limit on open files to `needed` if it is lower (the demo inherits
/// it); fails, saying why, when the hard limit is lower still.
fn raise_open_files_limit(needed: u64) {
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|current| current >= needed) {
        return;
    }
    assert!(
        limit.maximum.is_none_or(|maximum| maximum >= needed),
        "the hard limit on open files ({:?}) is below the {needed} this test needs; raise it (ulimit -Hn)",
        limit.maximum
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(needed),
            maximum: limit.maximum,
        },
    )
    .expect("raising the soft limit on open files");
}

/// `HALF_OPEN` connections to `addr`, each with a request head that never ends.
fn flood(addr: SocketAddr) -> Vec<TcpStream> {
    (0..HALF_OPEN)
        .map(|i| {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("connection {i} of the flood: {e}"));
            // The server may already have closed it to make room: that is the point.
            let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: flood\r\nX-Never-Ends: ");
            stream
        })
        .collect()
}

/// Whether the server has closed `stream` (EOF or reset) within `within`.
fn closed(stream: &mut TcpStream, within: Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0_u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn demo() -> Process {
    raise_open_files_limit(DESCRIPTORS);
    Process::start(&[
        "demo",
        "--log-format=json",
        "--hang-kind=none",
        "--health-probe-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
        "--duration=300s",
    ])
}

/// Floods `addr`, then checks that `path` is answered, that the cap was logged, and that
/// the connections left open are closed after the header timeout.
fn survives_a_flood(process: &Process, addr: SocketAddr, path: &str, server: &str) {
    let mut silent = TcpStream::connect(addr).unwrap();
    let mut stalled = flood(addr);

    // The client's own timeout is 5 seconds: an answer at all is what is checked here.
    let response = request(addr, "GET", path)
        .unwrap_or_else(|e| panic!("{path} under a flood of {HALF_OPEN}: {e}"));
    assert_eq!(response.status, 200, "{}", response.body);

    eventually(
        Duration::from_secs(30),
        "the connection cap log line",
        || {
            process
                .events()
                .iter()
                .any(|e| {
                    support::field(e, "message").starts_with("connection cap reached")
                        && support::field(e, "server") == server
                })
                .then_some(())
        },
    );
    // The first connection was closed early to make room; the newest are closed by the
    // header timeout (5 s), well within the bound.
    assert!(
        closed(&mut silent, Duration::from_secs(30)),
        "the silent one"
    );
    let newest = stalled.last_mut().unwrap();
    assert!(closed(newest, Duration::from_secs(30)), "the newest one");
    // And the server still answers once the flood is gone.
    drop(stalled);
    assert_eq!(request(addr, "GET", path).unwrap().status, 200);
}

#[test]
fn the_probe_port_survives_3000_half_open_connections() {
    let process = demo();
    survives_a_flood(
        &process,
        process.probe_address(),
        "/healthz",
        "probe-server",
    );
}

#[test]
fn the_metrics_port_survives_3000_half_open_connections() {
    let process = demo();
    let addr = process.metrics_address().expect("a metrics server");
    survives_a_flood(&process, addr, "/metrics", "metrics-server");
    // The probes, on their own server, were never touched.
    assert_eq!(
        request(process.probe_address(), "GET", "/healthz")
            .unwrap()
            .status,
        200
    );
}
