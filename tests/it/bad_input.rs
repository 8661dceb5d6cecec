//! Bad input never panics or hangs: malformed flags exit 2 naming the flag, a taken port
//! exits 1 naming the address, and the probe server shrugs off malformed requests.

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use support::{BIN, Process, get, request};

fn demo_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(BIN);
    command
        .arg("demo")
        .args(args)
        .args(["--duration=1s", "--health-probe-bind-address=127.0.0.1:0"])
        .env(support::DEBUG_ADDRESS_ENV, "127.0.0.1:0");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_malformed_flag_exits_2_naming_it() {
    let cases = [
        ("--health-probe-bind-address", "localhost"),
        ("--metrics-bind-address", "everywhere"),
        ("--debug-bind-address", "loopback"),
        ("--reconcile-deadline", "5 parsecs"),
        ("--reconcile-deadline", "0s"),
        ("--reconcile-deadline-for", "configmaps"),
        ("--reconcile-deadline-for", "configmaps=soon"),
        ("--watchdog-interval", "-1s"),
        ("--on-hang", "panic"),
        ("--cancel-escalation-count", "0"),
        ("--cancel-escalation-window", "forever"),
        ("--runtime-stall-threshold", "10"),
        ("--shutdown-grace", "a bit"),
        ("--log-format", "xml"),
        ("--hang-after", "later"),
        ("--hang-kind", "sleep"),
        ("--hang-for", "0s"),
        ("--duration", "1 fortnight"),
        ("--objects", "0"),
        ("--watch-stall-threshold", "0s"),
        ("--watch-stall-threshold", "soon"),
    ];
    for (flag, value) in cases {
        let (code, stderr) = demo_with(&[&format!("{flag}={value}")], &[]);
        assert_eq!(code, Some(2), "{flag}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("'{flag} ")),
            "{flag}={value} not named: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_malformed_environment_variable_names_its_flag() {
    let (code, stderr) = demo_with(
        &[],
        &[("RECONCILE_WATCHDOG_RECONCILE_DEADLINE", "whenever")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("'--reconcile-deadline "), "{stderr}");
    assert!(stderr.contains("expected a duration such as"), "{stderr}");
}

#[test]
fn an_unknown_flag_or_subcommand_exits_2() {
    for args in [&["demo", "--no-such-flag"][..], &["frobnicate"], &[]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn a_taken_probe_port_exits_1_naming_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let out = Command::new(BIN)
        .args(["demo", "--duration=5s", "--metrics-bind-address=0"])
        .arg(format!("--health-probe-bind-address={addr}"))
        .env(support::DEBUG_ADDRESS_ENV, "127.0.0.1:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("failed to bind {addr}")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// One malformed exchange, then the client shuts its write side: the server must answer
/// or close within the timeout, never hold the connection, never die.
fn malformed(addr: std::net::SocketAddr, i: usize) {
    let raw: Vec<u8> = match i % 8 {
        0 => (0..512).map(|b| (b * 37 + i) as u8).collect(),
        1 => format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(1024 * 1024)
        )
        .into_bytes(),
        2 => b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        3 => b"GET /healthz HTTP/9.9\r\n\r\n".to_vec(),
        4 => b"GET /%ff%fe/../../etc/passwd?exclude=%zz&verbose=\xff HTTP/1.1\r\n\r\n".to_vec(),
        5 => b"POST /healthz HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nshort".to_vec(),
        6 => b"\r\n\r\n\r\n".to_vec(),
        _ => b"GET /heal".to_vec(),
    };
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).expect("the server accepts");
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream.set_write_timeout(Some(timeout)).unwrap();
    // The server may close mid-write (an oversized header): that is an answer too.
    let _ = stream.write_all(&raw);
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = Vec::new();
    if let Err(e) = stream.read_to_end(&mut sink) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "malformed request {i} was held open: {e}"
        );
    }
}

#[test]
fn the_probe_server_survives_a_thousand_malformed_requests() {
    let process = Process::start(&[
        "demo",
        "--hang-kind=none",
        "--health-probe-bind-address=127.0.0.1:0",
        "--metrics-bind-address=0",
        "--duration=120s",
    ]);
    let addr = process.probe_address();
    for i in 0..1000 {
        malformed(addr, i);
    }
    // Odd methods and paths get proper answers, and /healthz still tells the truth.
    assert_eq!(request(addr, "DELETE", "/healthz").unwrap().status, 405);
    assert_eq!(request(addr, "GET", "/nope").unwrap().status, 404);
    let head = request(addr, "HEAD", "/readyz").unwrap();
    assert_eq!((head.status, head.body.as_str()), (200, ""));
    let healthz = get(addr, "/healthz");
    assert_eq!((healthz.status, healthz.body.as_str()), (200, "ok"));
    assert!(!process.logs().iter().any(|l| l.contains("panicked")));
}

#[test]
fn a_value_that_is_not_utf8_exits_2_naming_its_flag() {
    use std::os::unix::ffi::OsStrExt;
    let cases = [
        ("--reconcile-deadline", false),
        ("--health-probe-bind-address", true),
        ("--on-hang", true),
    ];
    for (flag, separate) in cases {
        let value = std::ffi::OsStr::from_bytes(b"5\xffs");
        let mut command = Command::new(BIN);
        command.arg("demo");
        if separate {
            command.arg(flag).arg(value);
        } else {
            let mut arg = std::ffi::OsString::from(format!("{flag}="));
            arg.push(value);
            command.arg(arg);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("'{flag}")), "{stderr}");
    }
}
