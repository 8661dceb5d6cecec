//! Helpers shared by the integration tests: a plain HTTP GET, the demo binary as a
//! child process, polling, and a strict OpenMetrics text parser.

#![allow(dead_code)] // each test crate uses its own subset

pub mod openmetrics;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_reconcile-watchdog");

/// One HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET url` over HTTP/1.1 with `Connection: close`; `url` is `http://host:port/path`.
pub fn get(url: &str) -> std::io::Result<Response> {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http URL: {url}"));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut stream = TcpStream::connect(authority)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8(raw).expect("the response is UTF-8");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {raw:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let response = Response {
        status,
        headers,
        body: body.to_owned(),
    };
    assert!(
        response.header("transfer-encoding").is_none(),
        "chunked responses are not expected from a String body: {response:?}"
    );
    if let Some(length) = response.header("content-length") {
        assert_eq!(
            length.parse::<usize>().ok(),
            Some(response.body.len()),
            "content-length"
        );
    }
    Ok(response)
}

/// Calls `f` every 100 ms until it returns Ok, or panics after `timeout` saying
/// what it waited for and what it saw last.
pub fn poll_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last seen:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `demo` subcommand running as a child process; killed when dropped.
pub struct Demo {
    child: Child,
    /// `http://127.0.0.1:PORT`, from the `probes:` line.
    pub probes: String,
    /// `http://127.0.0.1:PORT/metrics` from the `metrics:` line; None when it says `off`.
    pub metrics: Option<String>,
}

impl Demo {
    /// Starts `reconcile-watchdog demo ARGS` with the probes and metrics on free
    /// loopback ports (unless ARGS choose the metrics address) and waits for the URLs
    /// it prints.
    pub fn start(args: &[&str]) -> Self {
        let mut command = Command::new(BIN);
        command
            .arg("demo")
            .args(["--health-probe-bind-address", "127.0.0.1:0"]);
        // Never the default 0.0.0.0:8080: tests run in parallel.
        if !args.contains(&"--metrics-bind-address") {
            command.args(["--metrics-bind-address", "127.0.0.1:0"]);
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the demo starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines_tx, lines_rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining after the receiver is gone so the demo never meets a
            // closed pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        let mut demo = Self {
            child,
            probes: String::new(),
            metrics: None,
        };
        let mut metrics_line = false;
        let deadline = Instant::now() + Duration::from_secs(30);
        while demo.probes.is_empty() || !metrics_line {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = lines_rx
                .recv_timeout(left)
                .expect("the demo prints its URLs within 30 s");
            if let Some(urls) = line.strip_prefix("probes: ") {
                let first = urls.split(' ').next().unwrap_or_default();
                demo.probes = first
                    .strip_suffix("/healthz?verbose")
                    .unwrap_or_else(|| panic!("unexpected probes line {line:?}"))
                    .to_owned();
            } else if let Some(url) = line.strip_prefix("metrics: ") {
                metrics_line = true;
                demo.metrics = (url != "off").then(|| url.trim().to_owned());
            }
        }
        demo
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
