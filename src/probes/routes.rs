//! The answers of the probe endpoints, in the conventions of kube-apiserver and
//! controller-runtime.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde::Serialize;
use warp::http::{Method, Response, StatusCode, header};

use crate::guard::{InFlight, PollState, Registry};
use crate::health::{Checks, Health};

/// Answers probe requests from the health sets and the registry.
#[derive(Clone, Debug)]
pub struct Probes {
    health: Arc<Health>,
    registry: Registry,
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
    /// Probes over `health`, with the debug view of `registry`.
    #[must_use]
    pub fn new(health: Arc<Health>, registry: Registry) -> Self {
        Self { health, registry }
    }

    /// The response to `method path?query`. Never panics; HEAD gets GET's status and
    /// headers without a body.
    #[must_use]
    pub fn respond(&self, method: &Method, path: &str, query: &str) -> Response<String> {
        let mut response = self.respond_get(method, path, query);
        if method == Method::HEAD {
            response.body_mut().clear();
        }
        response
    }

    fn respond_get(&self, method: &Method, path: &str, query: &str) -> Response<String> {
        let route = route(path);
        if matches!(route, Route::NotFound) {
            return not_found();
        }
        if method != Method::GET && method != Method::HEAD {
            return method_not_allowed();
        }
        match route {
            Route::All(set) => self.all(self.set(set), &Query::parse(query)),
            Route::One(set, name) => self.one(self.set(set), name),
            Route::DebugReconciles => self.debug_reconciles(),
            Route::NotFound => unreachable!("handled above"),
        }
    }

    fn set(&self, set: Set) -> &Checks {
        match set {
            Set::Liveness => &self.health.liveness,
            Set::Readiness => &self.health.readiness,
        }
    }

    fn all(&self, checks: &Checks, query: &Query) -> Response<String> {
        let report = checks.run(&query.exclude);
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

    fn one(&self, checks: &Checks, name: &str) -> Response<String> {
        match checks.run_one(name) {
            Some(Ok(())) => text(StatusCode::OK, "ok".into()),
            Some(Err(reason)) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {reason}\n"),
            ),
            None => not_found(),
        }
    }

    fn debug_reconciles(&self) -> Response<String> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut rows: Vec<DebugReconcile> = self
            .registry
            .snapshot()
            .iter()
            .map(|r| DebugReconcile::of(r, now, wall))
            .collect();
        rows.sort_by(|a, b| {
            b.overdue
                .cmp(&a.overdue)
                .then(b.elapsed_seconds.total_cmp(&a.elapsed_seconds))
        });
        let body = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        let mut response = Response::new(body);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// One row of `/debug/reconciles`. The schema is documented in `docs/operations.md`.
#[derive(Debug, Serialize)]
struct DebugReconcile {
    controller: String,
    kind: String,
    object: String,
    started: String,
    elapsed_seconds: f64,
    deadline_seconds: f64,
    overdue: bool,
    state: &'static str,
    polls: u64,
    last_poll_ago_seconds: Option<f64>,
    thread: Option<String>,
    task_id: Option<u64>,
    cancel_requested: bool,
}

impl DebugReconcile {
    fn of(r: &InFlight, now: Instant, wall: SystemTime) -> Self {
        let elapsed = r.elapsed(now);
        // Wall-clock start derived from the monotonic age, consistent with `elapsed`.
        let started = wall.checked_sub(elapsed).unwrap_or(r.started_at);
        Self {
            controller: r.controller.to_string(),
            kind: r.kind.to_string(),
            object: r.object.to_string(),
            started: humantime::format_rfc3339_millis(started).to_string(),
            elapsed_seconds: elapsed.as_secs_f64(),
            deadline_seconds: r.deadline.as_secs_f64(),
            overdue: r.is_overdue(now),
            state: match r.poll {
                PollState::Awaiting => "awaiting",
                PollState::InPoll { .. } => "in-poll",
                PollState::Woken { .. } => "woken",
            },
            polls: r.polls,
            last_poll_ago_seconds: r.last_poll_ago(now).map(|d| d.as_secs_f64()),
            thread: r.thread.as_ref().map(|t| t.name.to_string()),
            task_id: r.task_id,
            cancel_requested: r.cancel_requested,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    Liveness,
    Readiness,
}

#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    All(Set),
    One(Set, &'a str),
    DebugReconciles,
    NotFound,
}

fn route(path: &str) -> Route<'_> {
    let (set, rest) = if let Some(rest) = path.strip_prefix("/healthz") {
        (Set::Liveness, rest)
    } else if let Some(rest) = path.strip_prefix("/livez") {
        (Set::Liveness, rest)
    } else if let Some(rest) = path.strip_prefix("/readyz") {
        (Set::Readiness, rest)
    } else if path == "/debug/reconciles" {
        return Route::DebugReconciles;
    } else {
        return Route::NotFound;
    };
    match rest {
        "" | "/" => Route::All(set),
        name => match name.strip_prefix('/') {
            Some(name) if !name.is_empty() && !name.contains('/') => Route::One(set, name),
            _ => Route::NotFound,
        },
    }
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
fn text(status: StatusCode, body: String) -> Response<String> {
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
    use std::time::Duration;

    use super::*;
    use crate::guard::ObjectKey;
    use crate::health::FnCheck;

    fn probes() -> (Probes, Arc<Health>) {
        let health = Arc::new(Health::new());
        health
            .liveness
            .add(Arc::new(FnCheck::new("reconcilers", || {
                Err("web default/site running 9s, deadline 5s (awaiting)".into())
            })));
        (
            Probes::new(Arc::clone(&health), Registry::new(Duration::from_secs(5))),
            health,
        )
    }

    #[test]
    fn routes() {
        assert_eq!(route("/healthz"), Route::All(Set::Liveness));
        assert_eq!(route("/livez/"), Route::All(Set::Liveness));
        assert_eq!(route("/readyz/ping"), Route::One(Set::Readiness, "ping"));
        assert_eq!(route("/healthzz"), Route::NotFound);
        assert_eq!(route("/healthz/a/b"), Route::NotFound);
        assert_eq!(route("/debug/reconciles"), Route::DebugReconciles);
        assert_eq!(route("/"), Route::NotFound);
    }

    #[test]
    fn failing_liveness_lists_the_reason() {
        let (probes, _) = probes();
        let r = probes.respond(&Method::GET, "/healthz", "verbose");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            r.body()
                .contains("[-]reconcilers failed: web default/site running 9s"),
            "{}",
            r.body()
        );
        assert!(r.body().ends_with("healthz check failed\n"));
    }

    #[test]
    fn exclude_and_readyz() {
        let (probes, _) = probes();
        let r = probes.respond(&Method::GET, "/livez", "exclude=reconcilers");
        assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "ok"));
        let r = probes.respond(&Method::GET, "/readyz", "verbose&exclude=nope");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.body()
                .contains("warn: some health checks cannot be excluded")
        );
        assert!(r.body().ends_with("readyz check passed\n"));
    }

    #[test]
    fn single_checks_methods_and_head() {
        let (probes, _) = probes();
        let r = probes.respond(&Method::GET, "/healthz/ping", "");
        assert_eq!((r.status(), r.body().as_str()), (StatusCode::OK, "ok"));
        let r = probes.respond(&Method::GET, "/healthz/reconcilers", "");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            r.body()
                .starts_with("internal server error: web default/site")
        );
        assert_eq!(
            probes.respond(&Method::GET, "/healthz/nope", "").status(),
            StatusCode::NOT_FOUND
        );
        let r = probes.respond(&Method::POST, "/healthz", "");
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        let r = probes.respond(&Method::HEAD, "/healthz", "");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(r.body().is_empty());
        assert_eq!(
            probes.respond(&Method::DELETE, "/nowhere", "").status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn debug_reconciles_sorts_overdue_first() {
        let registry = Registry::new(Duration::from_secs(3600));
        let _on_time = registry
            .controller("slow", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        let _overdue = registry
            .controller("late", "Widget")
            .with_deadline(Duration::ZERO)
            .register(ObjectKey::cluster("b"));
        let probes = Probes::new(Arc::new(Health::new()), registry.clone());
        let r = probes.respond(&Method::GET, "/debug/reconciles", "");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let rows: serde_json::Value = serde_json::from_str(r.body()).unwrap();
        assert_eq!(rows[0]["object"], "b");
        assert_eq!(rows[0]["overdue"], true);
        assert_eq!(rows[1]["object"], "ns/a");
        assert_eq!(rows[1]["overdue"], false);
        assert_eq!(rows[1]["state"], "awaiting");
        assert_eq!(rows[1]["polls"], 0);
    }
}
