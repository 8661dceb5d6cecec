//! The answers of the probe endpoints, in the conventions of kube-apiserver and
//! controller-runtime: `/healthz`, `/livez`, `/readyz` and their subpaths, nothing else.
//!
//! Failure reasons name objects, so like kube-apiserver they go only to loopback peers
//! (`kubectl port-forward`, `kubectl exec`) and to the log; other peers (the kubelet,
//! anyone who can reach the pod) read `reason withheld`, unless the operator chose to
//! show them to every peer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use warp::http::{Method, Response, StatusCode, header};

use super::server::Request;
use crate::health::{Checks, Health, Report};

/// What a peer that may not read failure reasons reads instead (kube-apiserver's words).
pub const REASON_WITHHELD: &str = "reason withheld";

/// At most one log line of withheld reasons per endpoint and period.
const WITHHELD_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Answers probe requests from the health sets.
#[derive(Clone, Debug)]
pub struct Probes {
    health: Arc<Health>,
    reasons_to_all_peers: bool,
    withheld_log: Arc<Mutex<[Option<Instant>; 2]>>,
}

/// What the query string asks for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Query {
    verbose: bool,
    exclude: Vec<String>,
}

impl Query {
    fn parse(raw: &str) -> Self {
        let mut query = Self::default();
        for (key, value) in form_urlencoded::parse(raw.as_bytes()) {
            match &*key {
                "verbose" => query.verbose = true,
                "exclude" => query.exclude.push(value.into_owned()),
                _ => {}
            }
        }
        query
    }
}

impl Probes {
    /// Probes over `health`; failure reasons go to loopback peers only.
    #[must_use]
    pub fn new(health: Arc<Health>) -> Self {
        Self {
            health,
            reasons_to_all_peers: false,
            withheld_log: Arc::default(),
        }
    }

    /// Shows failure reasons to every peer, not only to loopback ones.
    #[must_use]
    pub fn reasons_to_all_peers(mut self, yes: bool) -> Self {
        self.reasons_to_all_peers = yes;
        self
    }

    /// The response to `request`. Never panics; HEAD gets GET's status and headers
    /// without a body.
    #[must_use]
    pub fn respond(&self, request: &Request<'_>) -> Response<String> {
        head_without_body(request, self.respond_get(request))
    }

    fn respond_get(&self, request: &Request<'_>) -> Response<String> {
        let Some(route) = route(request.path) else {
            return not_found();
        };
        if request.method != Method::GET && request.method != Method::HEAD {
            return method_not_allowed();
        }
        let reasons = self.reasons_for(request.peer);
        match route {
            Route::All(set) => self.all(set, &Query::parse(request.query), reasons),
            Route::One(set, name) => self.one(set, name, reasons),
        }
    }

    /// Whether `peer` may read failure reasons.
    fn reasons_for(&self, peer: SocketAddr) -> Reasons {
        if self.reasons_to_all_peers || peer.ip().to_canonical().is_loopback() {
            Reasons::Shown
        } else {
            Reasons::Withheld
        }
    }

    fn set(&self, set: Set) -> &Checks {
        match set {
            Set::Liveness => &self.health.liveness,
            Set::Readiness => &self.health.readiness,
        }
    }

    fn all(&self, set: Set, query: &Query, reasons: Reasons) -> Response<String> {
        let mut report = self.set(set).run(&query.exclude);
        if reasons == Reasons::Withheld && !report.passed() {
            self.log_withheld(set, failures(&report));
            withhold(&mut report);
        }
        let passed = report.passed();
        // Like apiserver: a failure always lists the checks; success is `ok` unless
        // the listing is asked for.
        let body = if passed && !query.verbose {
            "ok".to_owned()
        } else {
            report.to_string()
        };
        let status = if passed {
            StatusCode::OK
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        text(status, body)
    }

    fn one(&self, set: Set, name: &str, reasons: Reasons) -> Response<String> {
        match self.set(set).run_one(name) {
            Some(Ok(())) => text(StatusCode::OK, "ok".into()),
            Some(Err(reason)) => {
                let reason = match reasons {
                    Reasons::Shown => reason,
                    Reasons::Withheld => {
                        self.log_withheld(set, [(name, reason.as_str())]);
                        REASON_WITHHELD.to_owned()
                    }
                };
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("internal server error: {reason}\n"),
                )
            }
            None => not_found(),
        }
    }

    /// Logs the reasons withheld from a peer, at most once per endpoint and period, so
    /// that the log has what the response has not.
    fn log_withheld<'r>(&self, set: Set, failures: impl IntoIterator<Item = (&'r str, &'r str)>) {
        let now = Instant::now();
        {
            let mut last = self
                .withheld_log
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let last = &mut last[set as usize];
            if last.is_some_and(|at| now.duration_since(at) < WITHHELD_LOG_PERIOD) {
                return;
            }
            *last = Some(now);
        }
        let probe = self.set(set).endpoint();
        for (check, reason) in failures {
            tracing::info!(
                probe,
                check,
                reason,
                "probe check failed; reason withheld from the peer"
            );
        }
    }
}

/// Whether the peer reads failure reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reasons {
    Shown,
    Withheld,
}

/// The failing checks of `report` with their reasons.
fn failures(report: &Report) -> impl Iterator<Item = (&str, &str)> {
    report
        .checks
        .iter()
        .filter_map(|check| match &check.result {
            Err(reason) => Some((check.name.as_str(), reason.as_str())),
            Ok(()) => None,
        })
}

/// Replaces every failure reason of `report` with [`REASON_WITHHELD`].
fn withhold(report: &mut Report) {
    for check in &mut report.checks {
        if let Err(reason) = &mut check.result {
            REASON_WITHHELD.clone_into(reason);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    Liveness = 0,
    Readiness = 1,
}

#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    All(Set),
    One(Set, &'a str),
}

/// The route of `path`; None for every path but the probes and their subpaths.
fn route(path: &str) -> Option<Route<'_>> {
    let (set, rest) = if let Some(rest) = path.strip_prefix("/healthz") {
        (Set::Liveness, rest)
    } else if let Some(rest) = path.strip_prefix("/livez") {
        (Set::Liveness, rest)
    } else if let Some(rest) = path.strip_prefix("/readyz") {
        (Set::Readiness, rest)
    } else {
        return None;
    };
    match rest {
        "" | "/" => Some(Route::All(set)),
        name => match name.strip_prefix('/') {
            Some(name) if !name.is_empty() && !name.contains('/') => Some(Route::One(set, name)),
            _ => None,
        },
    }
}

/// GET's answer to `request`, without its body when the method is HEAD (status and
/// headers stay): how every router here answers HEAD.
pub(crate) fn head_without_body(
    request: &Request<'_>,
    mut response: Response<String>,
) -> Response<String> {
    if request.method == Method::HEAD {
        response.body_mut().clear();
    }
    response
}

/// 404, worded as kube-apiserver words it.
pub(crate) fn not_found() -> Response<String> {
    text(StatusCode::NOT_FOUND, "404 page not found\n".into())
}

/// 405, with the methods that are allowed.
pub(crate) fn method_not_allowed() -> Response<String> {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed\n".into(),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
    response
}

/// A plain-text response with the headers every probe answer carries.
pub(crate) fn text(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::FnCheck;

    const LOOPBACK: &str = "127.0.0.1:40000";
    const KUBELET: &str = "10.0.0.1:40000";

    fn probes() -> Probes {
        let health = Arc::new(Health::new());
        health
            .liveness
            .add(Arc::new(FnCheck::new("reconcilers", || {
                Err("web default/site running 9s, deadline 5s (awaiting)".into())
            })));
        Probes::new(health)
    }

    /// `probes`' answer to `method path?query` from `peer`.
    fn ask(probes: &Probes, method: Method, target: &str, peer: &str) -> Response<String> {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        probes.respond(&Request {
            method: &method,
            path,
            query,
            peer: peer.parse().unwrap(),
        })
    }

    #[test]
    fn routes() {
        assert_eq!(route("/healthz"), Some(Route::All(Set::Liveness)));
        assert_eq!(route("/livez/"), Some(Route::All(Set::Liveness)));
        assert_eq!(
            route("/readyz/ping"),
            Some(Route::One(Set::Readiness, "ping"))
        );
        assert_eq!(route("/healthzz"), None);
        assert_eq!(route("/healthz/a/b"), None);
        assert_eq!(route("/debug/reconciles"), None);
        assert_eq!(route("/"), None);
    }

    #[test]
    fn debug_views_are_not_served_on_the_probe_port() {
        let probes = probes();
        for path in ["/debug/reconciles", "/debug/", "/debug/pprof"] {
            assert_eq!(
                ask(&probes, Method::GET, path, LOOPBACK).status(),
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
    }

    #[test]
    fn failing_liveness_lists_the_reason_to_loopback_peers() {
        let probes = probes();
        for peer in [LOOPBACK, "[::1]:5", "[::ffff:127.0.0.1]:5"] {
            let r = ask(&probes, Method::GET, "/healthz?verbose", peer);
            assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert!(
                r.body()
                    .contains("[-]reconcilers failed: web default/site running 9s"),
                "{peer}: {}",
                r.body()
            );
            assert!(r.body().ends_with("healthz check failed\n"));
        }
    }

    #[test]
    fn other_peers_read_reason_withheld() {
        let probes = probes();
        for peer in [KUBELET, "[fd00::1]:5", "0.0.0.0:1"] {
            for target in ["/healthz", "/healthz?verbose", "/livez/"] {
                let r = ask(&probes, Method::GET, target, peer);
                assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
                assert!(
                    r.body()
                        .contains("[-]reconcilers failed: reason withheld\n"),
                    "{peer} {target}: {}",
                    r.body()
                );
                assert!(!r.body().contains("default/site"), "{}", r.body());
                assert!(r.body().contains("[+]ping ok\n"));
            }
            let r = ask(&probes, Method::GET, "/healthz/reconcilers", peer);
            assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(r.body(), "internal server error: reason withheld\n");
        }
    }

    #[test]
    fn the_log_gets_the_withheld_reason_once_per_period() {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let probes = probes();
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                let _ = ask(&probes, Method::GET, "/healthz", KUBELET);
            }
            let _ = ask(&probes, Method::GET, "/healthz", LOOPBACK);
        });
        let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            log.matches("reason withheld from the peer").count(),
            1,
            "{log}"
        );
        assert!(
            log.contains("web default/site running 9s") && log.contains("check=\"reconcilers\""),
            "{log}"
        );
    }

    #[test]
    fn the_flag_shows_reasons_to_every_peer() {
        let probes = probes().reasons_to_all_peers(true);
        let r = ask(&probes, Method::GET, "/healthz", KUBELET);
        assert!(
            r.body()
                .contains("[-]reconcilers failed: web default/site running 9s"),
            "{}",
            r.body()
        );
        let r = ask(&probes, Method::GET, "/healthz/reconcilers", KUBELET);
        assert!(r.body().contains("web default/site"), "{}", r.body());
    }

    #[test]
    fn exclude_and_readyz() {
        let probes = probes();
        let r = ask(&probes, Method::GET, "/livez?exclude=reconcilers", KUBELET);
        assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "ok"));
        let r = ask(
            &probes,
            Method::GET,
            "/readyz?verbose&exclude=nope",
            KUBELET,
        );
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.body()
                .contains("warn: some health checks cannot be excluded")
        );
        assert!(r.body().ends_with("readyz check passed\n"));
    }

    #[test]
    fn single_checks_methods_and_head() {
        let probes = probes();
        let r = ask(&probes, Method::GET, "/healthz/ping", KUBELET);
        assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "ok"));
        let r = ask(&probes, Method::GET, "/healthz/reconcilers", LOOPBACK);
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            r.body()
                .starts_with("internal server error: web default/site")
        );
        assert_eq!(
            ask(&probes, Method::GET, "/healthz/nope", LOOPBACK).status(),
            StatusCode::NOT_FOUND
        );
        let r = ask(&probes, Method::POST, "/healthz", LOOPBACK);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        let r = ask(&probes, Method::HEAD, "/healthz", LOOPBACK);
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(r.body().is_empty());
        assert_eq!(
            ask(&probes, Method::DELETE, "/nowhere", LOOPBACK).status(),
            StatusCode::NOT_FOUND
        );
    }
}
