//! The debug views (`/debug/reconciles`), served on their own address (loopback by
//! default) and their own thread, so that a heavy view never delays a probe.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde::Serialize;
use warp::Filter;
use warp::http::{Response, StatusCode, header};

use super::response::{get_or_head, no_trailing_slash, raw_query, text, with_fallbacks};
use super::server::{Request, answer};
use crate::deadlines::{self, Advisor};
use crate::guard::{InFlight, PollState, Registry};
use crate::quarantine::Keeper;

/// Rows of `/debug/reconciles` unless `?limit=N` asks for another number.
pub(crate) const DEFAULT_ROW_LIMIT: usize = 1000;

/// The response header that gives the number of reconciles in flight, rows cut or not.
pub(crate) const TOTAL_HEADER: &str = "x-reconciles-in-flight";

/// The response header that gives the number of objects not reconciled while
/// quarantined (with a quarantine).
pub(crate) const QUARANTINED_HEADER: &str = "x-reconciles-quarantined";

/// The response header that names the first ten of them, `controller namespace/name`,
/// comma-separated.
pub(crate) const QUARANTINED_FIRST_HEADER: &str = "x-reconciles-quarantined-first";

/// Answers the debug views from the registry.
#[derive(Clone, Debug)]
pub struct DebugViews {
    registry: Registry,
    advisor: Option<Arc<Advisor>>,
    quarantine: Option<Arc<Keeper>>,
}

impl DebugViews {
    /// The debug views of `registry`.
    #[must_use]
    pub fn new(registry: Registry) -> Self {
        Self {
            registry,
            advisor: None,
            quarantine: None,
        }
    }

    /// Also says which objects `keeper` keeps quarantined (in both views).
    #[must_use]
    pub(crate) fn with_quarantine(mut self, keeper: Arc<Keeper>) -> Self {
        self.quarantine = Some(keeper);
        self
    }

    /// Also serves `/debug/deadlines` from `advisor`.
    #[must_use]
    pub fn with_advisor(mut self, advisor: Arc<Advisor>) -> Self {
        self.advisor = Some(advisor);
        self
    }

    /// The response the debug server gives `request` (its routes, without a socket).
    /// Never panics.
    #[must_use]
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn respond(&self, request: &Request<'_>) -> Response<String> {
        answer(self.routes(), request)
    }

    /// The debug server's routes: `GET|HEAD /debug/reconciles` (`?limit=N`) and, with an
    /// advisor, `/debug/deadlines`; 405 for other methods there, 404 everywhere else.
    pub(crate) fn routes(
        &self,
    ) -> impl Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync + 'static
    {
        let reconciles_path = warp::path!("debug" / "reconciles").and(no_trailing_slash());
        let views = self.clone();
        let reconciles =
            reconciles_path
                .and(get_or_head())
                .and(raw_query())
                .map(move |query: String| match row_limit(&query) {
                    Ok(limit) => views.reconciles(limit),
                    Err(message) => text(StatusCode::BAD_REQUEST, message),
                });
        // Only with an advisor: without one the path is unknown (404).
        let advisor = self.advisor.clone();
        let deadlines_path = warp::path!("debug" / "deadlines")
            .and(no_trailing_slash())
            .and_then(move || {
                std::future::ready(advisor.clone().ok_or_else(warp::reject::not_found))
            });
        let registry = self.registry.clone();
        let quarantine = self.quarantine.clone();
        let deadlines =
            deadlines_path
                .clone()
                .and(get_or_head())
                .map(move |advisor: Arc<Advisor>| {
                    deadlines::view::respond(&advisor, &registry, quarantine.as_deref())
                });
        let paths = reconciles_path
            .or(deadlines_path.map(|_| ()).untuple_one())
            .unify();
        with_fallbacks(reconciles.or(deadlines).unify(), paths)
    }

    fn reconciles(&self, limit: usize) -> Response<String> {
        let now = Instant::now();
        let wall = SystemTime::now();
        // The registry is copied one shard at a time (a shard's lock is held for a few
        // hundred rows), then only the rows shown are ordered and made into JSON: with
        // 100,000 in flight and the default limit, 1,000 rows, not 100,000.
        let mut in_flight = self.registry.snapshot();
        let total = in_flight.len();
        // The most overdue first: the oldest start first among the overdue, then the rest.
        let key = |r: &InFlight| (std::cmp::Reverse(r.is_overdue(now)), r.started);
        if limit < in_flight.len() {
            if limit > 0 {
                in_flight.select_nth_unstable_by_key(limit - 1, key);
            }
            in_flight.truncate(limit);
        }
        in_flight.sort_unstable_by_key(key);
        let rows: Vec<DebugReconcile> = in_flight
            .iter()
            .map(|r| DebugReconcile::of(r, now, wall))
            .collect();
        let body = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        headers.insert(TOTAL_HEADER, header::HeaderValue::from(total));
        if let Some(keeper) = &self.quarantine {
            // Not rows: nothing of theirs is in flight. Counted, the first few named.
            let (count, first) = keeper.quarantined_named();
            headers.insert(QUARANTINED_HEADER, header::HeaderValue::from(count));
            if let Ok(first) = header::HeaderValue::from_str(&first.join(", ")) {
                headers.insert(QUARANTINED_FIRST_HEADER, first);
            }
        }
        response
    }
}

/// `?limit=N`: how many rows at most (the most overdue first).
fn row_limit(query: &str) -> Result<usize, String> {
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if key == "limit" {
            return value
                .parse()
                .map_err(|_| format!("invalid limit {value:?}: expected a whole number\n"));
        }
    }
    Ok(DEFAULT_ROW_LIMIT)
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
    /// Where it waits, as the hang report says it (`InFlight::waiting`).
    waiting: Option<String>,
    /// The oldest API request in flight it sent.
    request: Option<DebugRequest>,
    /// The innermost labelled await pending.
    label: Option<&'static str>,
    /// Every clone of its waker has been dropped: it can never wake.
    no_waker: bool,
}

/// The oldest API request a reconcile waits on.
#[derive(Debug, Serialize)]
struct DebugRequest {
    method: String,
    path: String,
    sent_ago_seconds: f64,
    response_head: bool,
    more_in_flight: usize,
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
            waiting: r.waiting().map(|w| w.to_string()),
            request: r.request.as_ref().map(|q| DebugRequest {
                method: q.method.to_string(),
                path: q.path.clone(),
                sent_ago_seconds: q.sent_ago.as_secs_f64(),
                response_head: q.response_head,
                more_in_flight: q.more,
            }),
            label: r.label,
            no_waker: r.no_waker,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use warp::http::Method;

    use super::*;
    use crate::guard::ObjectKey;

    const PEER: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1);

    fn request<'a>(method: &'a Method, path: &'a str, query: &'a str) -> Request<'a> {
        Request {
            method,
            path,
            query,
            peer: PEER,
        }
    }

    #[test]
    fn reconciles_sorts_overdue_first_and_cuts_at_the_limit() {
        let registry = Registry::new(Duration::from_secs(3600));
        let _on_time = registry
            .controller("slow", "Widget")
            .register(ObjectKey::namespaced("ns", "a"));
        let _overdue = registry
            .controller("late", "Widget")
            .with_deadline(Duration::ZERO)
            .register(ObjectKey::cluster("b"));
        let views = DebugViews::new(registry);
        let r = views.respond(&request(&Method::GET, "/debug/reconciles", ""));
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(r.headers()[TOTAL_HEADER], "2");
        let rows: serde_json::Value = serde_json::from_str(r.body()).unwrap();
        assert_eq!(rows[0]["object"], "b");
        assert_eq!(rows[0]["overdue"], true);
        assert_eq!(rows[1]["object"], "ns/a");
        assert_eq!(rows[1]["overdue"], false);
        assert_eq!(rows[1]["state"], "awaiting");
        assert_eq!(rows[1]["polls"], 0);

        let r = views.respond(&request(&Method::GET, "/debug/reconciles", "limit=1"));
        let rows: Vec<serde_json::Value> = serde_json::from_str(r.body()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["object"], "b");
        assert_eq!(r.headers()[TOTAL_HEADER], "2");
    }

    #[test]
    fn reconciles_counts_the_quarantined_and_names_the_first_ten_in_headers() {
        use crate::quarantine::{Keeper, Quarantine};

        let registry = Registry::new(Duration::from_secs(3600));
        let views = DebugViews::new(registry.clone());
        let r = views.respond(&request(&Method::GET, "/debug/reconciles", ""));
        assert!(!r.headers().contains_key(QUARANTINED_HEADER));
        let keeper = Keeper::new(Quarantine::default());
        let views = DebugViews::new(registry).with_quarantine(Arc::clone(&keeper));
        let r = views.respond(&request(&Method::GET, "/debug/reconciles", ""));
        assert_eq!(r.headers()[QUARANTINED_HEADER], "0");
        assert_eq!(r.headers()[QUARANTINED_FIRST_HEADER], "");
        for i in 0..12 {
            keeper.announce_for_test("widgets", &format!("ns/w-{i:02}"));
        }
        keeper.announce_for_test("gadgets", "g");
        let r = views.respond(&request(&Method::GET, "/debug/reconciles", ""));
        assert_eq!(r.headers()[QUARANTINED_HEADER], "13");
        let first = r.headers()[QUARANTINED_FIRST_HEADER].to_str().unwrap();
        assert_eq!(first.split(", ").count(), 10, "{first}");
        assert!(first.starts_with("gadgets g, widgets ns/w-00, "), "{first}");
        assert_eq!(r.body(), "[]", "not rows: nothing of theirs is in flight");
    }

    #[test]
    fn other_paths_methods_and_bad_limits() {
        let views = DebugViews::new(Registry::new(Duration::from_secs(1)));
        for path in [
            "/healthz",
            "/debug",
            "/debug/reconciles/x",
            "/debug/reconciles/",
            "/debug/deadlines",
            "",
        ] {
            let r = views.respond(&request(&Method::GET, path, ""));
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
        }
        let r = views.respond(&request(&Method::POST, "/debug/reconciles", ""));
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        let r = views.respond(&request(&Method::GET, "/debug/reconciles", "limit=-1"));
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let r = views.respond(&request(&Method::HEAD, "/debug/reconciles", ""));
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.body().is_empty());
    }

    #[test]
    fn deadlines_only_with_an_advisor() {
        let views =
            DebugViews::new(Registry::new(Duration::from_secs(1))).with_advisor(Advisor::new());
        let r = views.respond(&request(&Method::GET, "/debug/deadlines", ""));
        assert_eq!(r.status(), StatusCode::OK);
        let r = views.respond(&request(&Method::DELETE, "/debug/deadlines", ""));
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        let r = views.respond(&request(&Method::GET, "/debug/deadlines/", ""));
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
