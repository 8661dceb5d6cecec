//! Shared by the integration tests: a minimal HTTP client and a handle on the binary.
#![allow(dead_code)] // each test binary uses a different part

pub mod blocked_worker;
pub mod openmetrics;
pub mod reports;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_reconcile-watchdog");

/// An HTTP response: status, headers and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The value of the first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `raw` bytes to `addr` and reads until the server closes, within `timeout`.
pub fn exchange(addr: SocketAddr, raw: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(raw)?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out)?;
    Ok(out)
}

/// `METHOD path` over HTTP/1.1 with `Connection: close`; a probe that does not answer
/// within 5 seconds is an error (the kubelet's default timeout is 1s).
pub fn request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Response> {
    let raw = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let bytes = exchange(addr, raw.as_bytes(), Duration::from_secs(5))?;
    parse(&bytes).ok_or_else(|| {
        std::io::Error::other(format!(
            "unparsable response: {:?}",
            String::from_utf8_lossy(&bytes)
        ))
    })
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn parse(bytes: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head
        .lines()
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}

/// The string field `key` of a JSON log event, or "" when absent.
pub fn field<'a>(event: &'a serde_json::Value, key: &str) -> &'a str {
    event[key].as_str().unwrap_or_default()
}

/// Polls `f` every 50 ms until it returns Some, or panics after `timeout` naming `what`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The environment variable of `--debug-bind-address`.
pub const DEBUG_ADDRESS_ENV: &str = "RECONCILE_WATCHDOG_DEBUG_BIND_ADDRESS";

/// A running `reconcile-watchdog` process whose stderr (the logs) is collected.
pub struct Process {
    pub child: Child,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Process {
    /// `demo` with JSON logs, a free probe port and no metrics server, then `extra`.
    pub fn demo(extra: &[&str]) -> Self {
        let mut args = vec![
            "demo",
            "--log-format=json",
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=0",
        ];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// Starts the binary with `args`.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// Starts the binary with `args` and extra environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.env_remove("RUST_LOG");
        // A free loopback port for the debug views unless the test names one: its
        // fixed default would collide between tests that run at once.
        command.env(DEBUG_ADDRESS_ENV, "127.0.0.1:0");
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("the binary starts");
        let stdout = collect(child.stdout.take().unwrap());
        let logs = collect(child.stderr.take().unwrap());
        Self {
            child,
            stdout,
            logs,
        }
    }

    /// The probe address `demo` prints on stdout.
    pub fn probe_address(&self) -> SocketAddr {
        eventually(Duration::from_secs(30), "the probe URL on stdout", || {
            self.stdout.lock().unwrap().iter().find_map(|line| {
                let rest = line.strip_prefix("probes: http://")?;
                rest.split('/').next()?.parse().ok()
            })
        })
    }

    /// The debug address `demo` prints on stdout; None when it prints `debug: off`.
    #[allow(dead_code)]
    pub fn debug_address(&self) -> Option<SocketAddr> {
        eventually(Duration::from_secs(30), "the debug line on stdout", || {
            self.stdout.lock().unwrap().iter().find_map(|line| {
                let rest = line.strip_prefix("debug: ")?;
                if rest == "off" {
                    return Some(None);
                }
                let addr = rest
                    .strip_prefix("http://")?
                    .strip_suffix("/debug/reconciles")?;
                Some(Some(addr.parse().ok()?))
            })
        })
    }

    /// The metrics address `demo` prints on stdout; None when it prints `metrics: off`.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        eventually(
            Duration::from_secs(30),
            "the metrics line on stdout",
            || {
                self.stdout.lock().unwrap().iter().find_map(|line| {
                    let rest = line.strip_prefix("metrics: ")?;
                    if rest == "off" {
                        return Some(None);
                    }
                    let addr = rest.strip_prefix("http://")?.strip_suffix("/metrics")?;
                    Some(Some(addr.parse().ok()?))
                })
            },
        )
    }

    /// The log lines so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The JSON log events so far (with `--log-format json`).
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.logs()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits for the process to exit, at most `timeout`; kills it after that.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            match line {
                Ok(line) => sink.lock().unwrap().push(line),
                Err(_) => break,
            }
        }
    });
    lines
}
