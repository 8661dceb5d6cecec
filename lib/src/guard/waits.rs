//! What an awaiting reconcile waits on: the API requests it sent, its innermost named
//! await, and whether any waker of it is still alive.
//!
//! The facts are kept on the reconcile's registry entry and written only off the guard's
//! common path: a request by the client layer as it is sent and as it completes, a
//! label by the guard when the innermost pending label changes between polls.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The facts of one entry; locked briefly by their writers, and only tried by readers
/// (the monitor never waits for a reconcile's thread).
#[derive(Default)]
pub(crate) struct Facts {
    /// The requests in flight, oldest first.
    requests: Vec<Arc<Outgoing>>,
    /// The innermost label pending at the end of the latest poll.
    label: Option<&'static str>,
}

/// One API request sent from inside a guarded reconcile, until its response ends or
/// is dropped.
#[derive(Debug)]
pub(crate) struct Outgoing {
    method: http::Method,
    path: http::uri::PathAndQuery,
    sent: Instant,
    head: AtomicBool,
}

impl Outgoing {
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))] // the request layer's
    pub(crate) fn new(method: http::Method, path: http::uri::PathAndQuery, sent: Instant) -> Self {
        Self {
            method,
            path,
            sent,
            head: AtomicBool::new(false),
        }
    }

    /// The response head has arrived; the body may still be streaming.
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))] // the request layer's
    pub(crate) fn head_arrived(&self) {
        self.head.store(true, Ordering::Relaxed);
    }
}

/// The facts of an entry, made at the first fact: an entry without any (no client
/// layer, no label) pays two words and a flag and no allocation for them, and its drop
/// one test.
pub(crate) struct FactsCell {
    facts: Mutex<Option<Box<Facts>>>,
    /// Set with the first fact of a reconcile, so that clearing them for the entry's next
    /// reconcile takes the lock only when there is something to clear.
    written: AtomicBool,
}

impl FactsCell {
    pub(crate) const fn new() -> Self {
        Self {
            facts: Mutex::new(None),
            written: AtomicBool::new(false),
        }
    }

    /// Empties them for the entry's next reconcile, keeping their allocation. Called
    /// once nothing but the entry's thread can write them.
    #[inline]
    pub(crate) fn clear(&self) {
        if self.written.load(Ordering::Acquire) {
            if let Some(facts) = self.lock().as_mut() {
                facts.requests.clear();
                facts.label = None;
            }
            self.written.store(false, Ordering::Relaxed);
        }
    }

    /// The facts, to write.
    fn write(&self) -> std::sync::MutexGuard<'_, Option<Box<Facts>>> {
        let facts = self.lock();
        self.written.store(true, Ordering::Release);
        facts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Box<Facts>>> {
        self.facts.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg_attr(not(feature = "_kube"), allow(dead_code))] // the request layer's
    pub(crate) fn request_sent(&self, request: Arc<Outgoing>) {
        self.write()
            .get_or_insert_with(Box::default)
            .requests
            .push(request);
    }

    #[cfg_attr(not(feature = "_kube"), allow(dead_code))] // the request layer's
    pub(crate) fn request_done(&self, request: &Arc<Outgoing>) {
        if let Some(facts) = self.lock().as_mut()
            && let Some(at) = facts.requests.iter().position(|r| Arc::ptr_eq(r, request))
        {
            facts.requests.remove(at);
        }
    }

    pub(crate) fn set_label(&self, label: Option<&'static str>) {
        let mut facts = self.write();
        match (facts.as_mut(), label) {
            (Some(facts), _) => facts.label = label,
            (None, Some(_)) => facts.get_or_insert_with(Box::default).label = label,
            (None, None) => {}
        }
    }

    /// What a snapshot shows of them at `now`; `None` when a writer holds them.
    pub(crate) fn read(&self, now: Instant) -> Option<(Option<RequestWait>, Option<&'static str>)> {
        let facts = self.facts.try_lock().ok()?;
        let Some(facts) = facts.as_ref() else {
            return Some((None, None));
        };
        let request = facts.requests.first().map(|oldest| RequestWait {
            method: oldest.method.clone(),
            path: redacted(&oldest.path),
            sent_ago: now.saturating_duration_since(oldest.sent),
            response_head: oldest.head.load(Ordering::Relaxed),
            more: facts.requests.len() - 1,
        });
        Some((request, facts.label))
    }
}

/// `path?name&name`: the query's parameter names without their values, which may carry
/// what a log must not (a token in a selector, say).
fn redacted(path: &http::uri::PathAndQuery) -> String {
    let mut out = path.path().to_owned();
    if let Some(query) = path.query() {
        for (i, (name, _)) in form_urlencoded::parse(query.as_bytes()).enumerate() {
            out.push(if i == 0 { '?' } else { '&' });
            out.push_str(&name);
        }
    }
    out
}

/// The oldest API request a reconcile waits on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestWait {
    /// `GET`, `PATCH`, ...
    pub method: http::Method,
    /// The path, with the query's parameter names and none of their values.
    pub path: String,
    /// How long ago it was sent, at the snapshot.
    pub sent_ago: Duration,
    /// Whether the response head has arrived (then the body is still streaming).
    pub response_head: bool,
    /// How many more requests of the reconcile are in flight.
    pub more: usize,
}

/// Where an awaiting reconcile waits, as far as the guard knows: one line for a
/// report, an Event's note or a debug row ([`InFlight::waiting`](super::InFlight::waiting)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting<'a> {
    /// Every clone of its waker has been dropped: nothing can wake it.
    NoWaker,
    /// An API request it sent, not answered (or not fully).
    Request(&'a RequestWait),
    /// The innermost pending await the operator's author named.
    Label(&'a str),
}

impl fmt::Display for Waiting<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoWaker => f.write_str("no waker alive: it can never wake"),
            Self::Request(r) => {
                write!(
                    f,
                    "waiting on {} {}, sent {} ago, {}",
                    r.method,
                    r.path,
                    // To the millisecond, as the reports date everything else.
                    humantime::format_duration(Duration::from_millis(
                        u64::try_from(r.sent_ago.as_millis()).unwrap_or(u64::MAX)
                    )),
                    if r.response_head {
                        "response head came, body still streaming"
                    } else {
                        "no response head"
                    }
                )?;
                match r.more {
                    0 => Ok(()),
                    1 => f.write_str(" (and 1 more request in flight)"),
                    n => write!(f, " (and {n} more requests in flight)"),
                }
            }
            Self::Label(label) => write!(f, "waiting in the await labelled {label:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &'static str, head: bool, more: usize) -> RequestWait {
        RequestWait {
            method: http::Method::GET,
            path: redacted(&http::uri::PathAndQuery::from_static(path)),
            sent_ago: Duration::from_millis(3120),
            response_head: head,
            more,
        }
    }

    #[test]
    fn a_request_is_named_without_query_values() {
        let r = request(
            "/api/v1/namespaces/default/configmaps?labelSelector=token%3Dsecret&watch=1",
            false,
            0,
        );
        assert_eq!(
            Waiting::Request(&r).to_string(),
            "waiting on GET /api/v1/namespaces/default/configmaps?labelSelector&watch, sent 3s 120ms ago, no response head"
        );
        let r = request("/api/v1/namespaces/default/configmaps/x", true, 2);
        assert_eq!(
            Waiting::Request(&r).to_string(),
            "waiting on GET /api/v1/namespaces/default/configmaps/x, sent 3s 120ms ago, response head came, body still streaming (and 2 more requests in flight)"
        );
    }

    #[test]
    fn the_oldest_request_is_named_and_the_rest_counted_until_done() {
        let facts = FactsCell::new();
        let t0 = Instant::now();
        let first = Arc::new(Outgoing::new(
            http::Method::GET,
            http::uri::PathAndQuery::from_static("/api/v1/namespaces/a/configmaps/b"),
            t0,
        ));
        let second = Arc::new(Outgoing::new(
            http::Method::PATCH,
            http::uri::PathAndQuery::from_static("/api/v1/namespaces/a/configmaps/c"),
            t0 + Duration::from_secs(1),
        ));
        facts.request_sent(Arc::clone(&first));
        facts.request_sent(Arc::clone(&second));
        first.head_arrived();
        let (request, label) = facts.read(t0 + Duration::from_secs(5)).unwrap();
        let request = request.unwrap();
        assert_eq!(request.path, "/api/v1/namespaces/a/configmaps/b");
        assert_eq!(request.sent_ago, Duration::from_secs(5));
        assert!(request.response_head);
        assert_eq!(request.more, 1);
        assert_eq!(label, None);

        facts.request_done(&first);
        let (request, _) = facts.read(t0 + Duration::from_secs(5)).unwrap();
        let request = request.unwrap();
        assert_eq!(request.method, http::Method::PATCH);
        assert!(!request.response_head);
        assert_eq!(request.more, 0);
        facts.request_done(&second);
        assert_eq!(facts.read(t0).unwrap().0, None);
    }
}
