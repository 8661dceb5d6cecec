//! The answers of the probe endpoints, in the conventions of kube-apiserver and
//! controller-runtime: `/healthz`, `/livez`, `/readyz` and their subpaths, nothing else.
//!
//! Failure reasons name objects, so like kube-apiserver they go only to loopback peers
//! (`kubectl port-forward`, `kubectl exec`) and to the log; other peers (the kubelet,
//! anyone who can reach the pod) read `reason withheld`, unless the operator chose to
//! show them to every peer.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use warp::Filter;
use warp::http::{Response, StatusCode};

// The filters the metrics server builds its routes from too.
pub(crate) use super::response::{get_or_head, no_trailing_slash, with_fallbacks};
use super::response::{not_found, raw_query, text};
use super::server::{Peer, Request, answer};
use crate::health::{Checks, Health, Report};

/// What a peer that may not read failure reasons reads instead (kube-apiserver's words).
pub(crate) const REASON_WITHHELD: &str = "reason withheld";

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

    /// The response the probe server gives `request` (its routes, without a socket).
    /// Never panics; HEAD gets GET's status and headers without a body.
    #[must_use]
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn respond(&self, request: &Request<'_>) -> Response<String> {
        answer(self.routes(), request)
    }

    /// The probe server's routes: `GET|HEAD` of `/healthz`, `/livez` and `/readyz`
    /// (with `?verbose` and repeated `?exclude=`) and of their checks
    /// (`/healthz/<check>`); 405 for other methods there, 404 everywhere else.
    pub(crate) fn routes(
        &self,
    ) -> impl Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync + 'static
    {
        let set = warp::path("healthz")
            .map(|| Set::Liveness)
            .or(warp::path("livez").map(|| Set::Liveness))
            .unify()
            .or(warp::path("readyz").map(|| Set::Readiness))
            .unify();
        let all = set.and(warp::path::end()).map(Route::All);
        // `/healthz/<check>`, and not `/healthz/<check>/`.
        let one = set
            .and(warp::path::param::<String>())
            .and(warp::path::end())
            .and(no_trailing_slash())
            .map(Route::One);
        let route = all.or(one).unify();
        let probes = self.clone();
        let answer = route
            .and(get_or_head())
            .and(raw_query())
            .and(warp::ext::optional::<Peer>())
            .map(move |route, query: String, peer: Option<Peer>| {
                probes.answer(route, &query, peer)
            });
        with_fallbacks(answer, route.map(|_| ()).untuple_one())
    }

    fn answer(&self, route: Route, query: &str, peer: Option<Peer>) -> Response<String> {
        let reasons = self.reasons_for(peer);
        match route {
            Route::All(set) => self.all(set, &Query::parse(query), reasons),
            Route::One(set, name) => self.one(set, &name, reasons),
        }
    }

    /// Whether `peer` may read failure reasons; a request without a peer may not.
    fn reasons_for(&self, peer: Option<Peer>) -> Reasons {
        if self.reasons_to_all_peers
            || peer.is_some_and(|Peer(peer)| peer.ip().to_canonical().is_loopback())
        {
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

/// What a probe path asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    /// Every check of a set.
    All(Set),
    /// One check of a set, by name.
    One(Set, String),
}

#[cfg(test)]
mod tests {
    use warp::http::{Method, header};

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
        let probes = probes();
        let status = |target| ask(&probes, Method::GET, target, LOOPBACK).status();
        // Liveness fails (its `reconcilers` check), readiness passes.
        for (target, expected) in [
            ("/healthz", StatusCode::INTERNAL_SERVER_ERROR),
            ("/livez/", StatusCode::INTERNAL_SERVER_ERROR),
            ("/healthz/reconcilers", StatusCode::INTERNAL_SERVER_ERROR),
            ("/readyz", StatusCode::OK),
            ("/readyz/ping", StatusCode::OK),
            ("/readyz?verbose&exclude=a&exclude=b", StatusCode::OK),
            ("/readyz/nope", StatusCode::NOT_FOUND),
            ("/healthzz", StatusCode::NOT_FOUND),
            ("/healthz/a/b", StatusCode::NOT_FOUND),
            ("/healthz/ping/", StatusCode::NOT_FOUND),
            ("/healthz//", StatusCode::NOT_FOUND),
            ("//healthz", StatusCode::NOT_FOUND),
            ("healthz", StatusCode::NOT_FOUND),
            ("/debug/reconciles", StatusCode::NOT_FOUND),
            ("/", StatusCode::NOT_FOUND),
            ("", StatusCode::NOT_FOUND),
        ] {
            assert_eq!(status(target), expected, "{target}");
        }
    }

    #[test]
    fn not_found_and_method_not_allowed_read_as_before() {
        let probes = probes();
        let r = ask(&probes, Method::GET, "/nowhere", LOOPBACK);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(r.body(), "404 page not found\n");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert_eq!(r.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let r = ask(&probes, Method::PUT, "/readyz/nope", LOOPBACK);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.body(), "method not allowed\n");
        assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        let r = ask(&probes, Method::HEAD, "/nowhere", LOOPBACK);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(r.body().is_empty());
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
