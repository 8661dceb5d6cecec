//! Watch freshness: when each watch the controllers run last showed a sign of life, and
//! the `watches` readiness check that fails when one has gone silent.
//!
//! A controller whose watch has silently stopped delivering reconciles nothing while
//! every probe says ok. The API server sends a bookmark on a quiet watch about once a
//! minute, but kube-runtime's `watcher::Event` does not surface bookmarks, and its
//! watcher reconnects only after minutes of silence. So the signs of life are taken
//! where every one of them is visible: a [`WatchLayer`] on the `kube::Client` dates the
//! response head of every successful list or watch of a watched resource, and every
//! frame received on it afterwards (an event, a bookmark, a page of a list). That costs
//! a clock read and an atomic maximum per frame, and nothing on other requests beyond
//! parsing the path of a GET (`docs/performance.md`).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use reconcile_watchdog::{Watchdog, kube::watches::{self, Watches}};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! let watches = Watches::new(Some(watches::DEFAULT_STALL_THRESHOLD));
//! let watchdog = Watchdog::builder().watches(watches.clone()).start()?;
//! let config = kube::Config::infer().await?;
//! let client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&watches.layer())
//!     .build();
//! // Each resource a controller watches, named as the API path names it.
//! watches.expect("configmaps", &watches::resource::<ConfigMap>(&()));
//! # let _ = client; Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::health::{FnCheck, Health};
use crate::monitor::summary::{NAMED, name_few};
use crate::monitor::verdict::fmt_duration;
pub use crate::plug::WatchAge;

/// The name of the readiness check that fails while a watch is silent.
pub const CHECK: &str = "watches";

/// The default `--watch-stall-threshold`: three bookmark periods of a real API server.
pub const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_secs(180);

/// `plural.group` (or `plural` for the core group): how the watches name a resource, as
/// its API path does.
#[must_use]
pub fn resource<K: kube_rs::Resource>(dynamic_type: &K::DynamicType) -> String {
    key(&K::group(dynamic_type), &K::plural(dynamic_type))
}

fn key(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// The resource a list or watch request is for: `/api/v1/[namespaces/NS/]PLURAL` or
/// `/apis/GROUP/VERSION/[namespaces/NS/]PLURAL`; None for any other path (one object,
/// discovery, a subresource).
fn collection_of(path: &str) -> Option<(&str, &str)> {
    let mut segments = path.trim_start_matches('/').split('/');
    let group = match segments.next()? {
        "api" => "",
        "apis" => segments.next()?,
        _ => return None,
    };
    let _version = segments.next()?;
    let rest: Vec<&str> = segments.collect();
    let plural = match rest[..] {
        [plural] => plural,
        ["namespaces", _, plural] => plural,
        _ => return None,
    };
    (!plural.is_empty()).then_some((group, plural))
}

/// The watches of a process: what each controller watches and when each resource last
/// showed a sign of life. Plugged into a [`Watchdog`](crate::Watchdog) with
/// [`Builder::watches`](crate::Builder::watches). Cheap to clone; clones share one table.
#[derive(Clone, Debug)]
pub struct Watches {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    epoch: Instant,
    watched: RwLock<Vec<Arc<Watched>>>,
    /// `None`: no check, no reports (`--watch-stall-threshold off`).
    threshold: Option<Duration>,
    /// The health sets the check joins, given as the watchdog starts.
    health: OnceLock<Weak<Health>>,
    /// Set once the readiness check and the reporter are installed (at the first
    /// expected watch, so a process without watches has no `watches` check).
    installed: OnceLock<()>,
}

#[derive(Debug)]
struct Watched {
    resource: String,
    controllers: Mutex<Vec<String>>,
    epoch: Instant,
    /// The latest sign of life, or the moment the watch was expected if later, in
    /// nanoseconds after `epoch`.
    last: AtomicU64,
    /// Reported silent (WARN) and not yet reported back (INFO).
    reported: AtomicBool,
}

impl Watched {
    fn since(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A sign of life at `at`.
    fn touch_at(&self, at: Instant) {
        self.last.fetch_max(self.since(at), Ordering::Relaxed);
    }

    fn age(&self, now: Instant) -> Duration {
        Duration::from_nanos(
            self.since(now)
                .saturating_sub(self.last.load(Ordering::Relaxed)),
        )
    }

    fn seen(&self, now: Instant) -> WatchAge {
        WatchAge {
            controllers: self
                .controllers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            resource: self.resource.clone(),
            age: self.age(now),
        }
    }
}

/// A change to report: a watch went silent (WARN) or showed life again (INFO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Silent(WatchAge),
    Recovered(WatchAge),
}

impl Watches {
    /// Watches checked against `threshold` ([`DEFAULT_STALL_THRESHOLD`] is a good
    /// value; `None` or zero: never), whose check joins the watchdog's readiness at the
    /// first expected watch.
    #[must_use]
    pub fn new(threshold: Option<Duration>) -> Self {
        Self {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                watched: RwLock::new(Vec::new()),
                threshold: threshold.filter(|t| !t.is_zero()),
                health: OnceLock::new(),
                installed: OnceLock::new(),
            }),
        }
    }

    /// Says that `controller` watches `resource` (`plural.group`, see [`resource`]):
    /// from now on it must show a sign of life within the stall threshold. Expecting it
    /// again (a controller restarted, a lease taken again) counts from now again.
    pub fn expect(&self, controller: &str, resource: &str) {
        self.expect_at(controller, resource, Instant::now());
        self.install();
    }

    fn expect_at(&self, controller: &str, resource: &str, now: Instant) {
        let mut watched = self
            .inner
            .watched
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let entry = match watched.iter().find(|w| w.resource == resource) {
            Some(entry) => Arc::clone(entry),
            None => {
                let entry = Arc::new(Watched {
                    resource: resource.to_owned(),
                    controllers: Mutex::new(Vec::new()),
                    epoch: self.inner.epoch,
                    last: AtomicU64::new(0),
                    reported: AtomicBool::new(false),
                });
                watched.push(Arc::clone(&entry));
                entry
            }
        };
        let mut controllers = entry.controllers.lock().unwrap_or_else(|p| p.into_inner());
        if !controllers.iter().any(|c| c == controller) {
            controllers.push(controller.to_owned());
        }
        entry.touch_at(now);
    }

    /// Says that `controller` no longer watches anything (it stopped, or was dropped):
    /// a resource no controller expects any more leaves the `watches` check and the
    /// `watch_age` series.
    pub fn forget(&self, controller: &str) {
        let mut watched = self
            .inner
            .watched
            .write()
            .unwrap_or_else(|p| p.into_inner());
        watched.retain(|w| {
            let mut controllers = w.controllers.lock().unwrap_or_else(|p| p.into_inner());
            controllers.retain(|c| c != controller);
            !controllers.is_empty()
        });
    }

    /// The layer for `kube::client::ClientBuilder::with_layer` that dates the signs of
    /// life of the expected watches.
    #[must_use]
    pub fn layer(&self) -> WatchLayer {
        WatchLayer {
            watches: self.clone(),
        }
    }

    fn find(&self, path: &str) -> Option<Arc<Watched>> {
        let (group, plural) = collection_of(path)?;
        let watched = self.inner.watched.read().unwrap_or_else(|p| p.into_inner());
        watched
            .iter()
            .find(|w| {
                // `plural.group` without allocating: the plural, then the group.
                let r = w.resource.as_str();
                match r.strip_prefix(plural) {
                    Some("") => group.is_empty(),
                    Some(rest) => rest.strip_prefix('.') == Some(group),
                    None => false,
                }
            })
            .map(Arc::clone)
    }

    /// Every expected watch and its age at `now`.
    #[must_use]
    pub fn ages(&self, now: Instant) -> Vec<WatchAge> {
        self.inner
            .watched
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|w| w.seen(now))
            .collect()
    }

    /// The `watches` check at `now`: the silent ones named (the oldest few, the rest
    /// counted per controller).
    pub(crate) fn check_at(&self, now: Instant, threshold: Duration) -> Result<(), String> {
        let silent: Vec<WatchAge> = self
            .ages(now)
            .into_iter()
            .filter(|w| w.age > threshold)
            .collect();
        if silent.is_empty() {
            return Ok(());
        }
        Err(name_few(
            &silent,
            NAMED,
            "; ",
            |w| w.age,
            |w| {
                format!(
                    "{}: watch of {} silent for {} (threshold {})",
                    w.controllers.join(","),
                    w.resource,
                    fmt_duration(w.age),
                    fmt_duration(threshold)
                )
            },
            |w| w.controllers.join(","),
        ))
    }

    /// What changed since the last call: watches newly silent past `threshold`, and
    /// silent ones that showed life again. Each silence is told once, and its end once.
    pub(crate) fn changes_at(&self, now: Instant, threshold: Duration) -> Vec<Change> {
        let watched = self.inner.watched.read().unwrap_or_else(|p| p.into_inner());
        let mut changes = Vec::new();
        for w in watched.iter() {
            let silent = w.age(now) > threshold;
            if silent != w.reported.load(Ordering::Relaxed) {
                w.reported.store(silent, Ordering::Relaxed);
                let seen = w.seen(now);
                changes.push(if silent {
                    Change::Silent(seen)
                } else {
                    Change::Recovered(seen)
                });
            }
        }
        changes
    }

    /// Adds the readiness check and starts the reporter, once, if a threshold is set,
    /// a watch is expected and the watchdog has started.
    fn install(&self) {
        let Some(threshold) = self.inner.threshold else {
            return;
        };
        let Some(health) = self.inner.health.get() else {
            return;
        };
        if self
            .inner
            .watched
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            return;
        }
        self.inner.installed.get_or_init(|| {
            if let Some(health) = health.upgrade() {
                let watches = self.clone();
                health.readiness.add(Arc::new(FnCheck::new(CHECK, move || {
                    watches.check_at(Instant::now(), threshold)
                })));
            }
            let inner = Arc::downgrade(&self.inner);
            // A plain thread: the reports must not wait on the runtime they are about.
            let started = std::thread::Builder::new()
                .name("watch-freshness".into())
                .spawn(move || report_until_dropped(&inner, threshold));
            if let Err(error) = started {
                tracing::error!(%error, "the watch freshness reporter did not start; the watches check still runs");
            }
        });
    }
}

impl crate::plug::WatchAges for Watches {
    fn attach(&self, health: &Arc<Health>) {
        let _ = self.inner.health.set(Arc::downgrade(health));
        self.install();
    }

    fn ages(&self, now: Instant) -> Vec<WatchAge> {
        Watches::ages(self, now)
    }
}

/// Writes a WARN when a watch goes silent and an INFO when it recovers, until the
/// watches are dropped.
fn report_until_dropped(inner: &Weak<Inner>, threshold: Duration) {
    let tick = (threshold / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        std::thread::sleep(tick);
        let Some(inner) = inner.upgrade() else {
            return;
        };
        for change in (Watches { inner }).changes_at(Instant::now(), threshold) {
            match change {
                Change::Silent(w) => {
                    let controllers = w.controllers.join(",");
                    tracing::warn!(
                        controller = %controllers,
                        resource = %w.resource,
                        silent_for = %fmt_duration(w.age),
                        threshold = %fmt_duration(threshold),
                        "watch silent: {controllers} has had no event, bookmark or list of {} for {}; readiness fails (check {CHECK})",
                        w.resource,
                        fmt_duration(w.age),
                    );
                }
                Change::Recovered(w) => {
                    let controllers = w.controllers.join(",");
                    tracing::info!(
                        controller = %controllers,
                        resource = %w.resource,
                        "watch alive again: {controllers} hears from {} again",
                        w.resource,
                    );
                }
            }
        }
    }
}

/// Dates the signs of life of the expected watches on a `kube::Client`'s requests.
#[derive(Clone, Debug)]
pub struct WatchLayer {
    watches: Watches,
}

impl<S> tower_layer::Layer<S> for WatchLayer {
    type Service = WatchService<S>;

    fn layer(&self, inner: S) -> WatchService<S> {
        WatchService {
            inner,
            watches: self.watches.clone(),
        }
    }
}

/// The service of a [`WatchLayer`].
#[derive(Clone, Debug)]
pub struct WatchService<S> {
    inner: S,
    watches: Watches,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for WatchService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<WatchBody<ResBody>>;
    type Error = S::Error;
    type Future = WatchFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // Lists and watches are GETs of a collection; everything else passes untouched.
        let watched = if request.method() == http::Method::GET {
            self.watches.find(request.uri().path())
        } else {
            None
        };
        WatchFuture {
            inner: self.inner.call(request),
            watched,
        }
    }
}

pin_project! {
    /// The response future of a [`WatchService`].
    pub struct WatchFuture<F> {
        #[pin]
        inner: F,
        watched: Option<Arc<Watched>>,
    }
}

impl<F, B, E> Future for WatchFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<WatchBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        // Only a success is a sign of life: an error status is the server refusing.
        let watched = this
            .watched
            .take()
            .filter(|_| response.status().is_success());
        if let Some(watched) = &watched {
            watched.touch_at(Instant::now());
        }
        Poll::Ready(Ok(response.map(|inner| WatchBody { inner, watched })))
    }
}

pin_project! {
    /// A response body that dates every frame received on a watched resource.
    pub struct WatchBody<B> {
        #[pin]
        inner: B,
        watched: Option<Arc<Watched>>,
    }
}

impl<B: Body> Body for WatchBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let (Some(Ok(_)), Some(watched)) = (&frame, this.watched.as_ref()) {
            watched.touch_at(Instant::now());
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn watches(threshold: Option<Duration>) -> (Watches, Arc<Health>) {
        let health = Arc::new(Health::new());
        let watches = Watches::new(threshold);
        crate::plug::WatchAges::attach(&watches, &health);
        (watches, health)
    }

    #[test]
    fn collections_are_told_from_objects_and_discovery() {
        assert_eq!(
            collection_of("/api/v1/configmaps"),
            Some(("", "configmaps"))
        );
        assert_eq!(
            collection_of("/api/v1/namespaces/prod/configmaps"),
            Some(("", "configmaps"))
        );
        assert_eq!(
            collection_of("/apis/watchdog.example.com/v1/namespaces/prod/configtemplates"),
            Some(("watchdog.example.com", "configtemplates"))
        );
        assert_eq!(
            collection_of("/apis/watchdog.example.com/v1/configtemplates"),
            Some(("watchdog.example.com", "configtemplates"))
        );
        for other in [
            "/api/v1/namespaces/prod/configmaps/app",
            "/api/v1/namespaces/prod",
            "/apis/watchdog.example.com/v1",
            "/apis",
            "/version",
            "/api/v1/namespaces/prod/configmaps/app/status",
        ] {
            assert_eq!(collection_of(other), None, "{other}");
        }
        assert_eq!(
            collection_of("/api/v1/namespaces"),
            Some(("", "namespaces"))
        );
    }

    #[test]
    fn a_watch_silent_past_the_threshold_fails_the_check_once_reported() {
        let (watches, _health) = watches(Some(3 * SECOND));
        let t0 = Instant::now();
        watches.expect_at(
            "configtemplates",
            "configtemplates.watchdog.example.com",
            t0,
        );
        watches.expect_at("configtemplates", "configmaps", t0);
        watches.expect_at("secrets", "configmaps", t0);
        let threshold = 3 * SECOND;

        // Within the threshold of being expected: no sign of life yet, no failure.
        assert_eq!(watches.check_at(t0 + 2 * SECOND, threshold), Ok(()));
        assert!(watches.changes_at(t0 + 2 * SECOND, threshold).is_empty());

        // The ConfigMaps watch hears a bookmark; the templates stay silent.
        let found = watches.find("/api/v1/namespaces/prod/configmaps").unwrap();
        found.touch_at(t0 + 2 * SECOND);
        assert!(
            watches
                .find("/apis/watchdog.example.com/v1/configtemplates")
                .is_some()
        );
        assert!(
            watches
                .find("/apis/other.example.com/v1/configtemplates")
                .is_none()
        );

        let at = t0 + 4 * SECOND;
        assert_eq!(
            watches.check_at(at, threshold),
            Err("configtemplates: watch of configtemplates.watchdog.example.com silent for 4s (threshold 3s)".into())
        );
        let changes = watches.changes_at(at, threshold);
        assert_eq!(
            changes,
            vec![Change::Silent(WatchAge {
                controllers: vec!["configtemplates".into()],
                resource: "configtemplates.watchdog.example.com".into(),
                age: 4 * SECOND,
            })]
        );
        // Told once.
        assert!(watches.changes_at(at + SECOND, threshold).is_empty());

        // A sign of life: passes again, and the recovery is told once.
        watches
            .find("/apis/watchdog.example.com/v1/namespaces/a/configtemplates")
            .unwrap()
            .touch_at(t0 + 6 * SECOND);
        found.touch_at(t0 + 5 * SECOND); // the ConfigMaps' next bookmark
        assert_eq!(watches.check_at(t0 + 6 * SECOND, threshold), Ok(()));
        assert!(matches!(
            &watches.changes_at(t0 + 6 * SECOND, threshold)[..],
            [Change::Recovered(w)] if w.resource == "configtemplates.watchdog.example.com"
        ));
        assert!(watches.changes_at(t0 + 6 * SECOND, threshold).is_empty());

        // Both controllers of a shared resource are named.
        let ages = watches.ages(t0 + 6 * SECOND);
        assert!(
            ages.iter()
                .any(|w| w.resource == "configmaps"
                    && w.controllers == ["configtemplates", "secrets"])
        );
    }

    #[test]
    fn a_forgotten_controller_leaves_the_watches_it_alone_expected() {
        let (watches, _health) = watches(Some(SECOND));
        let t0 = Instant::now();
        watches.expect_at("templates", "configtemplates.example.com", t0);
        watches.expect_at("templates", "configmaps", t0);
        watches.expect_at("secrets", "configmaps", t0);
        watches.forget("templates");
        let ages = watches.ages(t0);
        assert_eq!(ages.len(), 1, "{ages:?}");
        assert_eq!(ages[0].resource, "configmaps");
        assert_eq!(ages[0].controllers, ["secrets"]);
        // Silent or not, a forgotten watch fails nothing.
        assert!(
            watches
                .check_at(t0 + 10 * SECOND, SECOND)
                .unwrap_err()
                .starts_with("secrets: watch of configmaps")
        );
        watches.forget("secrets");
        assert!(watches.ages(t0).is_empty());
        assert_eq!(watches.check_at(t0 + 10 * SECOND, SECOND), Ok(()));
    }

    #[test]
    fn many_silent_watches_are_named_few_and_counted() {
        let (watches, _health) = watches(Some(SECOND));
        let t0 = Instant::now();
        for i in 0..40 {
            watches.expect_at("bulk", &format!("things{i}.example.com"), t0);
        }
        let text = watches.check_at(t0 + 10 * SECOND, SECOND).unwrap_err();
        assert!(text.contains("and 35 more: bulk 35"), "{text}");
        assert!(text.len() < 1024, "{text}");
    }

    #[test]
    fn the_check_joins_readiness_at_the_first_expected_watch_unless_off() {
        let (watches, health) = watches(Some(DEFAULT_STALL_THRESHOLD));
        assert!(!health.readiness.names().contains(&CHECK.to_owned()));
        watches.expect("configtemplates", "configmaps");
        assert!(health.readiness.names().contains(&CHECK.to_owned()));
        assert_eq!(health.readiness.run_one(CHECK), Some(Ok(())));

        let (off, health) = self::watches(None);
        off.expect("configtemplates", "configmaps");
        assert!(!health.readiness.names().contains(&CHECK.to_owned()));
    }

    #[test]
    fn resources_are_named_as_their_paths_name_them() {
        use k8s::api::coordination::v1::Lease;
        use k8s::api::core::v1::ConfigMap;
        assert_eq!(resource::<ConfigMap>(&()), "configmaps");
        assert_eq!(resource::<Lease>(&()), "leases.coordination.k8s.io");
    }
}
