//! The binary's `demo` hangs, seen from outside: the stack in a `block` hang's report,
//! and the probes of a wedged runtime.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The demo, killed when dropped, with its stdout and stderr lines arriving on
/// channels as they are written (each with the instant it was read).
struct Demo {
    child: Child,
    stdout: Receiver<(Instant, String)>,
    stderr: Receiver<(Instant, String)>,
}

impl Demo {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reconcile-watchdog"))
            .arg("demo")
            .args(["--health-probe-bind-address", "127.0.0.1:0"])
            .args(["--log-format", "json", "--duration", "5m"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// The probe address the demo printed.
    fn probe_address(&self) -> SocketAddr {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, line) = self
                .stdout
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("the demo prints its probe URL");
            if let Some(rest) = line.strip_prefix("probes: http://") {
                return rest.split('/').next().unwrap().parse().unwrap();
            }
        }
    }

    /// The first JSON log line that `matches`, with when it was read.
    fn log_line(
        &self,
        what: &str,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> (Instant, serde_json::Value) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let Ok((at, line)) = self
                .stderr
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            else {
                panic!("no log line with {what}");
            };
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&line)
                && matches(&json)
            {
                return (at, json);
            }
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(pipe: impl Read + Send + 'static) -> Receiver<(Instant, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

fn field<'a>(json: &'a serde_json::Value, name: &str) -> &'a str {
    json.get(name).and_then(|v| v.as_str()).unwrap_or_default()
}

/// One GET over a fresh connection; a probe that does not answer within `timeout`
/// fails the test.
fn get(addr: SocketAddr, path: &str, timeout: Duration) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, timeout).expect("the probe server accepts");
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream.set_write_timeout(Some(timeout)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("the probe did not answer within {timeout:?}: {e}"));
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn a_block_hang_reports_the_blocking_frames() {
    let demo = Demo::start(&[
        "--hang-kind",
        "block",
        "--hang-after",
        "500ms",
        "--reconcile-deadline",
        "1s",
        "--watchdog-interval",
        "100ms",
    ]);
    let (_, hung) = demo.log_line("the block hang's report", |json| {
        field(json, "message").starts_with("reconcile hung:")
            && field(json, "object") == "demo/cert-7"
    });
    assert_eq!(field(&hung, "state"), "in-poll", "{hung}");
    assert_eq!(field(&hung, "level"), "ERROR", "{hung}");
    let stack = field(&hung, "stack");
    assert!(stack.contains("take_config_lock"), "{stack}");
    assert!(
        stack.contains("futex") || stack.contains("Mutex") || stack.contains("lock"),
        "{stack}"
    );
    let kernel = field(&hung, "kernel_state");
    assert!(kernel.starts_with("state S"), "{kernel}");
}

#[test]
fn a_wedged_runtime_fails_healthz_while_the_probe_keeps_answering() {
    let threshold = Duration::from_secs(1);
    let interval = Duration::from_millis(200);
    let demo = Demo::start(&[
        "--hang-kind",
        "wedge",
        "--hang-after",
        "1s",
        "--runtime-stall-threshold",
        "1s",
        "--watchdog-interval",
        "200ms",
        // Only the runtime check should speak.
        "--reconcile-deadline",
        "10m",
    ]);
    let addr = demo.probe_address();
    let (status, body) = get(addr, "/healthz?verbose", Duration::from_secs(5));
    assert_eq!(status, 200, "{body}");

    let (injected, _) = demo.log_line("the injection", |json| {
        field(json, "message") == "injecting a hang"
    });
    // Every answer must come within the timeout, before and after the flip.
    let (failed_at, body) = loop {
        let (status, body) = get(addr, "/healthz?verbose", Duration::from_secs(5));
        if status == 500 && body.contains("[-]runtime failed:") {
            break (Instant::now(), body);
        }
        assert!(injected.elapsed() < PATIENCE, "never failed: {body}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(body.contains("healthz check failed"), "{body}");
    assert!(body.contains("[+]ping ok"), "{body}");
    eprintln!(
        "healthz failed {:?} after the injection (threshold {threshold:?} + 2 x {interval:?} = {:?})",
        failed_at.saturating_duration_since(injected),
        threshold + interval * 2
    );
    for _ in 0..5 {
        let (status, body) = get(addr, "/healthz/runtime", Duration::from_secs(5));
        assert_eq!(status, 500, "{body}");
        std::thread::sleep(interval);
    }
    let (_, stalled) = demo.log_line("the stall report", |json| {
        field(json, "message").starts_with("async runtime stalled")
    });
    assert!(
        field(&stalled, "stack").contains("take_config_lock"),
        "{stalled}"
    );
    assert_eq!(stalled.get("workers").and_then(|w| w.as_u64()), Some(4));
}
