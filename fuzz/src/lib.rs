//! The bodies of the fuzz targets, shared by cargo-fuzz (`fuzz_targets/`, nightly) and
//! by `tests/fuzz_corpus.rs`, which replays every corpus file through them on stable.
//!
//! Each body checks properties, not only the absence of panics: the routers answer with
//! the statuses they document and never leak a reason to a stranger, a bad flag value
//! exits 2 naming its flag, and the fault annotation accepts exactly its four forms.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{Method, StatusCode, header};
use reconcile_watchdog::guard::{ObjectKey, Registry};
use reconcile_watchdog::health::{FnCheck, Health};
use reconcile_watchdog::internals::deadlines::Advisor;
use reconcile_watchdog::internals::probes::{DebugViews, Probes, Request};
use reconcile_watchdog_operator::operator::fault::Fault;

/// The failure reason of the fixture's failing check; strangers must never read it.
const SECRET: &str = "secret-namespace/secret-object";

struct Fixture {
    probes: Probes,
    views: DebugViews,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let health = Arc::new(Health::new());
        health
            .liveness
            .add(Arc::new(FnCheck::new("reconcilers", || {
                Err(format!("web {SECRET} running 9s, deadline 5s"))
            })));
        let registry = Registry::new(Duration::from_secs(3600));
        // In flight for the whole run: the debug view has a row to render.
        std::mem::forget(
            registry
                .controller("web", "Widget")
                .register(ObjectKey::namespaced("secret-namespace", "secret-object")),
        );
        Fixture {
            probes: Probes::new(health),
            views: DebugViews::new(registry).with_advisor(Advisor::new()),
        }
    })
}

/// `method \n path \n query`, the last byte choosing the peer (odd: loopback), into
/// the probe router and the debug router.
pub fn probe_request(data: &[u8]) {
    let Some((&peer_byte, rest)) = data.split_last() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.splitn(3, '\n');
    let (method, path, query) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    // hyper refuses a method that is not a token before it reaches a router.
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let loopback = peer_byte % 2 == 1;
    let peer: SocketAddr = if loopback {
        ([127, 0, 0, 1], 40000).into()
    } else {
        ([10, 0, 0, 7], 40000).into()
    };
    let request = Request {
        method: &method,
        path,
        query,
        peer,
    };
    let fixture = fixture();

    let probe = fixture.probes.respond(&request);
    assert!(
        [
            StatusCode::OK,
            StatusCode::NOT_FOUND,
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::INTERNAL_SERVER_ERROR
        ]
        .contains(&probe.status()),
        "probe {method} {path:?} {query:?}: {}",
        probe.status()
    );
    assert!(probe.headers().contains_key(header::CONTENT_TYPE));
    if !loopback {
        assert!(
            !probe.body().contains(SECRET),
            "leaked to a stranger: {probe:?}"
        );
    }
    if path.starts_with("/debug") {
        assert_eq!(
            probe.status(),
            StatusCode::NOT_FOUND,
            "{path:?} on the probe port"
        );
    }

    let debug = fixture.views.respond(&request);
    assert!(
        [
            StatusCode::OK,
            StatusCode::BAD_REQUEST,
            StatusCode::NOT_FOUND,
            StatusCode::METHOD_NOT_ALLOWED
        ]
        .contains(&debug.status()),
        "debug {method} {path:?} {query:?}: {}",
        debug.status()
    );
    for response in [&probe, &debug] {
        if method == Method::HEAD {
            assert!(response.body().is_empty(), "HEAD with a body: {response:?}");
        }
    }
}

/// The flags that take a value, `demo`'s set.
const VALUED_FLAGS: [&str; 19] = [
    "--health-probe-bind-address",
    "--metrics-bind-address",
    "--debug-bind-address",
    "--reconcile-deadline",
    "--reconcile-deadline-for",
    "--watchdog-interval",
    "--on-hang",
    "--cancel-escalation-count",
    "--cancel-escalation-window",
    "--runtime-stall-threshold",
    "--stack-capture-after",
    "--shutdown-grace",
    "--log-format",
    "--hang-after",
    "--hang-kind",
    "--hang-for",
    "--duration",
    "--near-miss-threshold",
    "--near-miss-every",
];

/// The first byte picks a flag, the rest is its value (any bytes): parsing either
/// succeeds or fails with exit status 2 and a message that names the flag.
pub fn flag_values(data: &[u8]) {
    let Some((&which, value)) = data.split_first() else {
        return;
    };
    let flag = VALUED_FLAGS[usize::from(which) % VALUED_FLAGS.len()];
    let mut arg = OsString::from(format!("{flag}="));
    arg.push(OsStr::from_bytes(value));
    let args = [OsString::from("reconcile-watchdog"), "demo".into(), arg];
    let Err(error) = reconcile_watchdog_operator::cli::parse_from(args) else {
        return;
    };
    assert_eq!(error.exit_code(), 2, "{error}");
    let message = error.to_string();
    assert!(
        message.contains(flag),
        "{flag}={:?}: the message does not name the flag: {message}",
        String::from_utf8_lossy(value)
    );
}

/// The fault annotation's value: exactly `hang`, `block`, `panic` or `sleep=DURATION`
/// (spaces around allowed) are accepted, and a refusal quotes the value.
pub fn fault_annotation(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let trimmed = value.trim();
    match value.parse::<Fault>() {
        Ok(Fault::Hang) => assert_eq!(trimmed, "hang"),
        Ok(Fault::Block) => assert_eq!(trimmed, "block"),
        Ok(Fault::Panic) => assert_eq!(trimmed, "panic"),
        Ok(Fault::Sleep(duration)) => {
            let spelled = trimmed.strip_prefix("sleep=").expect("sleep= form");
            assert_eq!(humantime::parse_duration(spelled.trim()), Ok(duration));
        }
        Err(error) => {
            assert!(!["hang", "block", "panic"].contains(&trimmed));
            assert!(
                error.to_string().contains(&format!("{trimmed:?}")),
                "{error}"
            );
        }
    }
}
