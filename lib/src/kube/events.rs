//! Hang reports as Kubernetes Events on the hung objects, sent from a thread and runtime
//! of their own.
//!
//! `kubectl describe` and `kubectl get events` are where a Kubernetes user looks first
//! for an object that does not converge. [`HangEvents`], plugged into the watchdog with
//! [`Builder::hang_reports`](crate::Builder::hang_reports), publishes each
//! per-reconcile line of the hang report as an events.k8s.io/v1 Event on the object:
//! a `Warning` `ReconcileHung` when it crosses its deadline, whose reminders count up
//! the same Event's series instead of making new ones; a `Normal` `ReconcileHangEnded`
//! when it ends; a `Warning` `ReconcileCancelled` when `--on-hang cancel` stopped it.
//! With a [quarantine](crate::quarantine), [`Controllers`](super::Controllers) publish
//! through it a `Warning` `ReconcileQuarantined` on an object whose reconcile they skip,
//! and a `Normal` `ReconcileQuarantineLifted` when they reconcile it again.
//!
//! Events never hurt the reconciles they describe. The monitor thread only hands each
//! report to a bounded queue; a thread of their own, with a current-thread runtime and
//! a client of its own, writes them, each write within a timeout, never on the watched
//! runtime. A full queue or a write that fails or times out drops the Event: counted in
//! `reconcile_watchdog_events_dropped_total`, with one WARN a minute at most. They get
//! the log's lines, so the log's budget bounds them: at most `burst` writes at once and
//! `per_minute` after (10 and 6 by default), however many objects hang.
//!
//! With [`own_pod_from_env`](HangEvents::own_pod_from_env), the operator's own Pod gets a
//! `Warning` `LivenessFailing` Event when liveness begins to fail because of hung
//! reconciles, an escalation or a runtime stall (once per failing episode), whose note
//! names the first culprits and where they are stuck: `kubectl describe pod` shows it
//! beside the kubelet's probe failure.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use reconcile_watchdog::{Watchdog, kube::events::HangEvents};
//!
//! let events = HangEvents::new(HangEvents::instance_from_env());
//! // Where the objects of each controller are: their API version and kind (and, with
//! // `Controllers::hang_events`, their uid from the controller's cache).
//! events.controller::<ConfigMap>("configmaps", &(), None);
//! let watchdog = Watchdog::builder().hang_reports(events.clone()).start()?;
//! events.start(kube::Config::infer().await?)?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s::api::core::v1::ObjectReference;
use k8s::api::events::v1::Event;
use k8s::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s::jiff::Timestamp;
use kube_rs::api::{Api, Patch, PatchParams, PostParams};
use kube_rs::runtime::reflector::{ObjectRef, Store};
use kube_rs::{Resource, ResourceExt};

use crate::guard::ObjectKey;
use crate::monitor::HangState;
use crate::monitor::verdict::fmt_duration;
use crate::plug::{HangReport, Reported};
use crate::restart::Cause;

/// The Events' reporting controller.
pub const REPORTING_CONTROLLER: &str = "reconcile-watchdog";

/// The Events' action: what the hung object was undergoing.
pub const ACTION: &str = "Reconcile";

/// Reports waiting for the events thread at most; more are dropped. A budgeted burst
/// (10 by default) fits several times over.
const QUEUE: usize = 64;

/// The longest one write (create or patch) may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long after its last write a series still takes repeats; later, a repeat starts a
/// new Event. client-go's and kube-runtime's recorders use 6 minutes.
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The shortest time between two WARNs about dropped Events.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The API server refuses a note over 1 kB.
const NOTE_LIMIT: usize = 1024;

/// The longest object name an Event's name has room for beside its suffix (a dot and 16
/// hex digits) within the 253 characters of a name.
const NAME_ROOM: usize = 253 - 17;

/// Errors of the Events publisher.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused to start its thread.
    #[error("failed to start the events thread")]
    Spawn(#[source] std::io::Error),
}

/// The Events' reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Reason {
    /// `Warning` `ReconcileHung`: past its deadline; its reminders join its series.
    Hung,
    /// `Normal` `ReconcileHangEnded`: it ended after the hang.
    HangEnded,
    /// `Warning` `ReconcileCancelled`: the watchdog cancelled it; it will be requeued.
    Cancelled,
    /// `Warning` `ReconcileQuarantined`: its hangs failed liveness; it is not reconciled.
    Quarantined,
    /// `Normal` `ReconcileQuarantineLifted`: it is reconciled again.
    QuarantineLifted,
    /// `Warning` `LivenessFailing`, on the operator's own Pod: liveness began to fail.
    LivenessFailing,
}

impl Reason {
    /// The Event's reason.
    fn as_str(self) -> &'static str {
        match self {
            Self::Hung => "ReconcileHung",
            Self::HangEnded => "ReconcileHangEnded",
            Self::Cancelled => "ReconcileCancelled",
            Self::Quarantined => "ReconcileQuarantined",
            Self::QuarantineLifted => "ReconcileQuarantineLifted",
            Self::LivenessFailing => "LivenessFailing",
        }
    }

    /// The Event's type: `Warning` or `Normal`.
    fn event_type(self) -> &'static str {
        match self {
            Self::Hung | Self::Cancelled | Self::Quarantined | Self::LivenessFailing => "Warning",
            Self::HangEnded | Self::QuarantineLifted => "Normal",
        }
    }

    fn of(reported: Reported) -> Self {
        match reported {
            Reported::Hung | Reported::StillHung => Self::Hung,
            Reported::Ended => Self::HangEnded,
            Reported::Cancelled => Self::Cancelled,
        }
    }
}

/// Finds an object's uid, by namespace and name.
type UidLookup = Box<dyn Fn(Option<&str>, &str) -> Option<String> + Send + Sync>;

/// What an Event needs to know of a controller's objects.
struct Objects {
    api_version: String,
    kind: String,
    /// From the controller's cache: `kubectl describe` finds an object's Events by its
    /// uid too.
    uid: Option<UidLookup>,
}

/// One report on its way to the events thread.
struct Job {
    reason: Reason,
    controller: Arc<str>,
    object: ObjectKey,
    objects: Arc<Objects>,
    note: String,
}

/// Publishes hang reports as Events on the hung objects; see the [module](self).
pub struct HangEvents {
    instance: String,
    objects: RwLock<HashMap<String, Arc<Objects>>>,
    /// The operator's own Pod, for `LivenessFailing`.
    pod: RwLock<Option<(ObjectKey, Arc<Objects>)>>,
    /// `None` wakes the thread to see `stop`.
    queue: SyncSender<Option<Job>>,
    jobs: Mutex<Option<Receiver<Option<Job>>>>,
    drops: Arc<Drops>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for HangEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let controllers: Vec<String> = self
            .objects
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        f.debug_struct("HangEvents")
            .field("instance", &self.instance)
            .field("controllers", &controllers)
            .field("dropped", &self.drops.count.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl HangEvents {
    /// A publisher whose Events name `instance` (the pod's name, say) as their reporting
    /// instance. It queues reports at once and writes them once [`start`](Self::start)ed.
    #[must_use]
    pub fn new(instance: impl Into<String>) -> Arc<Self> {
        let (queue, jobs) = mpsc::sync_channel(QUEUE);
        Arc::new(Self {
            instance: instance.into(),
            objects: RwLock::default(),
            pod: RwLock::default(),
            queue,
            jobs: Mutex::new(Some(jobs)),
            drops: Arc::default(),
            stop: Arc::default(),
            thread: Mutex::new(None),
        })
    }

    /// The reporting instance from the environment: `POD_NAME` (set it from the
    /// downward API), else `HOSTNAME`, else the reporting controller's name.
    #[must_use]
    pub fn instance_from_env() -> String {
        ["POD_NAME", "HOSTNAME"]
            .iter()
            .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
            .unwrap_or_else(|| REPORTING_CONTROLLER.to_owned())
    }

    /// Says what the objects of `controller` (the name its guard uses) are: `K` with
    /// `dyntype` (`&()` for a static type, the `ApiResource` of a `DynamicObject`).
    /// With the controller's `store`, the Events carry the object's uid, which
    /// `kubectl describe` looks for; without one, `kubectl get events` still lists them.
    /// A controller never named here gets no Events.
    pub fn controller<K>(&self, controller: &str, dyntype: &K::DynamicType, store: Option<Store<K>>)
    where
        K: Resource + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        let uid = store.map(|store| {
            let dyntype = dyntype.clone();
            Box::new(move |namespace: Option<&str>, name: &str| {
                let key = ObjectRef::<K>::new_with(name, dyntype.clone());
                let key = match namespace {
                    Some(namespace) => key.within(namespace),
                    None => key,
                };
                store.get(&key).and_then(|object| object.uid())
            }) as UidLookup
        });
        let objects = Objects {
            api_version: K::api_version(dyntype).into_owned(),
            kind: K::kind(dyntype).into_owned(),
            uid,
        };
        self.objects
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(controller.to_owned(), Arc::new(objects));
    }

    /// Publishes a `LivenessFailing` Event on the Pod `namespace`/`name` (uid `uid`,
    /// which `kubectl describe pod` matches Events by) when liveness begins to fail:
    /// the operator's own Pod.
    pub fn own_pod(&self, namespace: &str, name: &str, uid: Option<String>) {
        let objects = Objects {
            api_version: "v1".into(),
            kind: "Pod".into(),
            uid: uid.map(|uid| {
                Box::new(move |_: Option<&str>, _: &str| Some(uid.clone())) as UidLookup
            }),
        };
        *self.pod.write().unwrap_or_else(|p| p.into_inner()) =
            Some((ObjectKey::namespaced(namespace, name), Arc::new(objects)));
    }

    /// [`own_pod`](Self::own_pod) from the downward API's `POD_NAMESPACE`, `POD_NAME`
    /// and `POD_UID`; whether both names were set (without them, no Event).
    pub fn own_pod_from_env(&self) -> bool {
        let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (var("POD_NAMESPACE"), var("POD_NAME")) {
            (Some(namespace), Some(name)) => {
                self.own_pod(namespace.trim(), name.trim(), var("POD_UID"));
                true
            }
            _ => false,
        }
    }

    /// Queues `job`, or counts it dropped.
    fn send(&self, job: Job) {
        match self.queue.try_send(Some(job)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.drops.one("the queue is full", Instant::now()),
            Err(TrySendError::Disconnected(_)) => {
                self.drops
                    .one("the events thread has stopped", Instant::now());
            }
        }
    }

    /// Starts writing the Events to the API server of `config` (the operator's own),
    /// with a client of its own. Does nothing when already started.
    pub fn start(&self, config: kube_rs::Config) -> Result<(), Error> {
        let Some(jobs) = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        let writer = Writer {
            instance: self.instance.clone(),
            stop: Arc::clone(&self.stop),
            drops: Arc::clone(&self.drops),
        };
        let thread = std::thread::Builder::new()
            .name("hang-events".into())
            .spawn(move || writer.run(config, &jobs))
            .map_err(Error::Spawn)?;
        *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        Ok(())
    }
}

impl HangEvents {
    /// Publishes a quarantine's Event on `object` of `controller`: a `Warning`
    /// `ReconcileQuarantined`, or a `Normal` `ReconcileQuarantineLifted`.
    pub(crate) fn announce(
        &self,
        controller: &str,
        object: &ObjectKey,
        announcement: &crate::quarantine::Announcement,
    ) {
        let reason = if announcement.warning {
            Reason::Quarantined
        } else {
            Reason::QuarantineLifted
        };
        let mut note = announcement.note.clone();
        truncate(&mut note, NOTE_LIMIT);
        self.enqueue(reason, controller, object, note);
    }

    /// Queues an Event for the events thread; drops and counts it when the queue is full.
    fn enqueue(&self, reason: Reason, controller: &str, object: &ObjectKey, note: String) {
        let objects = self
            .objects
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(controller)
            .cloned();
        let Some(objects) = objects else {
            return;
        };
        let job = Job {
            reason,
            controller: controller.into(),
            object: object.clone(),
            objects,
            note,
        };
        self.send(job);
    }
}

impl crate::plug::HangReports for HangEvents {
    fn reported(&self, report: &HangReport<'_>) {
        self.enqueue(
            Reason::of(report.reported),
            report.controller,
            report.object,
            note(report),
        );
    }

    fn dropped(&self) -> u64 {
        self.drops.count.load(Ordering::Relaxed)
    }

    fn liveness_failing(&self, cause: &Cause) {
        let pod = self.pod.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some((object, objects)) = pod else {
            return;
        };
        self.send(Job {
            reason: Reason::LivenessFailing,
            controller: REPORTING_CONTROLLER.into(),
            object,
            objects,
            note: liveness_note(cause),
        });
    }
}

/// The note of a `LivenessFailing` Event: the cause's lines joined by `; `, at most
/// 1 kB.
fn liveness_note(cause: &Cause) -> String {
    // Room for the `; ` that each of the few lines that fit adds to its newline.
    let mut note = cause.text(NOTE_LIMIT - 32).replace('\n', "; ");
    truncate(&mut note, NOTE_LIMIT);
    note
}

impl Drop for HangEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = thread {
            // Wake a thread waiting for work; one writing ends within its timeout.
            let _ = self.queue.try_send(None);
            let _ = thread.join();
        }
    }
}

/// The Events dropped, counted, and the WARN about them.
#[derive(Debug, Default)]
struct Drops {
    count: AtomicU64,
    warnings: Mutex<DropWarnings>,
}

impl Drops {
    /// Counts one dropped Event at `now`, and WARNs if none did within a minute.
    fn one(&self, why: &str, now: Instant) {
        let total = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let warn = self
            .warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .dropped(now);
        if let Some(since_last) = warn {
            tracing::warn!(
                dropped = total,
                since_last_warning = since_last,
                why,
                "hang Events dropped: {since_last} since the last warning ({total} in all); the log has every hang"
            );
        }
    }
}

/// The rate limit of the WARN about dropped Events.
#[derive(Debug, Default)]
struct DropWarnings {
    last: Option<Instant>,
    since_last: u64,
}

impl DropWarnings {
    /// One more dropped at `now`: how many since the last WARN, if one is due now.
    fn dropped(&mut self, now: Instant) -> Option<u64> {
        self.since_last += 1;
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= WARN_EVERY);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since_last))
    }
}

/// The note of an Event: what the log's line says, at most 1 kB. (What it waits on,
/// once the report knows, is one more clause here.)
fn note(report: &HangReport<'_>) -> String {
    let (elapsed, deadline) = (fmt_duration(report.elapsed), fmt_duration(report.deadline));
    let controller = report.controller;
    let mut note = match report.reported {
        Reported::Hung | Reported::StillHung => {
            let state = report.state.map_or("", explain);
            let action = report.action.map_or("", |a| a.as_str());
            let waiting = report.waiting.map(|w| format!("; {w}")).unwrap_or_default();
            format!(
                "reconcile by {controller} has run {elapsed}, past its {deadline} deadline; {state}{waiting}; {action}"
            )
        }
        Reported::Ended => {
            let outcome = report.outcome.map_or("", |o| o.as_str());
            format!(
                "reconcile by {controller} ended ({outcome}) after {elapsed}, past its {deadline} deadline"
            )
        }
        Reported::Cancelled => format!(
            "reconcile by {controller} cancelled after {elapsed}, past its {deadline} deadline; the controller requeues it"
        ),
    };
    truncate(&mut note, NOTE_LIMIT);
    note
}

fn explain(state: HangState) -> &'static str {
    match state {
        HangState::Awaiting => "waiting on an await that never woke",
        HangState::InPoll => "stuck inside a poll (a blocking call, a lock or a busy loop)",
        HangState::Starved => {
            "starved: woken but not polled (a blocked worker or a stalled runtime)"
        }
    }
}

/// Cuts `s` to at most `limit` bytes, on a character boundary.
fn truncate(s: &mut String, limit: usize) {
    if s.len() > limit {
        let mut end = limit;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// What tells one series from another: a repeat of the same reason on the same object
/// by the same controller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    reason: Reason,
    controller: Arc<str>,
    api_version: String,
    kind: String,
    object: ObjectKey,
}

/// One Event written, and how many times it has been seen.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Series {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

/// What to write for a report.
#[derive(Debug, PartialEq, Eq)]
enum Write {
    /// A new Event.
    Create,
    /// One more in the series of the Event `name`: its count becomes `count`.
    Repeat {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// The series written lately: the pure part of the publisher.
#[derive(Debug, Default)]
struct Book {
    series: HashMap<SeriesKey, Series>,
}

impl Book {
    /// What to write for `key` at `now`. Forgets the series nobody repeated within the
    /// TTL, so the book holds at most the Events of the last 6 minutes (which the
    /// report budget bounds).
    fn next(&mut self, key: &SeriesKey, now: Instant) -> Write {
        self.series
            .retain(|_, series| now.saturating_duration_since(series.last) < SERIES_TTL);
        match self.series.get(key) {
            Some(series) => Write::Repeat {
                namespace: series.namespace.clone(),
                name: series.name.clone(),
                count: series.count.saturating_add(1),
            },
            None => Write::Create,
        }
    }

    /// The Event `name` was created for `key` at `now`.
    fn created(&mut self, key: SeriesKey, namespace: String, name: String, now: Instant) {
        let series = Series {
            namespace,
            name,
            count: 1,
            last: now,
        };
        self.series.insert(key, series);
    }

    /// The series of `key` now counts `count`, at `now`.
    fn repeated(&mut self, key: &SeriesKey, count: i32, now: Instant) {
        if let Some(series) = self.series.get_mut(key) {
            series.count = count;
            series.last = now;
        }
    }

    /// The Event of `key` is gone (expired on the server, or deleted).
    fn forget(&mut self, key: &SeriesKey) {
        self.series.remove(key);
    }
}

/// The events thread.
struct Writer {
    instance: String,
    stop: Arc<AtomicBool>,
    drops: Arc<Drops>,
}

impl Writer {
    fn run(self, mut config: kube_rs::Config, jobs: &Receiver<Option<Job>>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(%error, "the events thread cannot start its runtime; no hang Events");
                return;
            }
        };
        config.connect_timeout = Some(WRITE_TIMEOUT);
        config.read_timeout = Some(WRITE_TIMEOUT);
        config.write_timeout = Some(WRITE_TIMEOUT);
        // Built inside the runtime: the client's buffer spawns its worker there.
        let client = match runtime.block_on(async { kube_rs::Client::try_from(config) }) {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(error = %super::error_chain(&error), "the events thread has no client; no hang Events");
                return;
            }
        };
        let mut book = Book::default();
        while let Ok(job) = jobs.recv() {
            let Some(job) = job.filter(|_| !self.stop.load(Ordering::Acquire)) else {
                return;
            };
            let written = runtime.block_on(async {
                tokio::time::timeout(
                    WRITE_TIMEOUT,
                    self.write(&client, &mut book, &job, Instant::now()),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(format!("no answer within {}", fmt_duration(WRITE_TIMEOUT)))
                })
            });
            if let Err(error) = written {
                let why = format!(
                    "{} on {} {}: {error}",
                    job.reason.as_str(),
                    job.objects.kind,
                    job.object
                );
                self.drops.one(&why, Instant::now());
            }
        }
    }

    /// Writes the Event of `job`: a new one, or one more in its series.
    async fn write(
        &self,
        client: &kube_rs::Client,
        book: &mut Book,
        job: &Job,
        now: Instant,
    ) -> Result<(), String> {
        let (namespace, name) = split(&job.object);
        let key = SeriesKey {
            reason: job.reason,
            controller: Arc::clone(&job.controller),
            api_version: job.objects.api_version.clone(),
            kind: job.objects.kind.clone(),
            object: job.object.clone(),
        };
        if let Write::Repeat {
            namespace: events_namespace,
            name: event,
            count,
        } = book.next(&key, now)
        {
            let events: Api<Event> = Api::namespaced(client.clone(), &events_namespace);
            let patch = serde_json::json!({
                "note": job.note,
                "series": {"count": count, "lastObservedTime": MicroTime(Timestamp::now())},
            });
            match events
                .patch(&event, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    book.repeated(&key, count, now);
                    return Ok(());
                }
                // Gone (the server keeps Events an hour): start a new one.
                Err(kube_rs::Error::Api(status)) if status.code == 404 => book.forget(&key),
                Err(error) => return Err(super::error_chain(&error)),
            }
        }
        let uid = job
            .objects
            .uid
            .as_ref()
            .and_then(|uid| uid(namespace, name));
        let event = self.event(job, namespace, name, uid);
        let events_namespace = event.metadata.namespace.clone().unwrap_or_default();
        let events: Api<Event> = Api::namespaced(client.clone(), &events_namespace);
        let created = events
            .create(&PostParams::default(), &event)
            .await
            .map_err(|e| super::error_chain(&e))?;
        book.created(key, events_namespace, created.name_any(), now);
        Ok(())
    }

    /// A new Event of `job` on the object `namespace`/`name`.
    fn event(&self, job: &Job, namespace: Option<&str>, name: &str, uid: Option<String>) -> Event {
        let now = Timestamp::now();
        let stem: String = name.chars().take(NAME_ROOM).collect();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{stem}.{:x}", now.as_nanosecond())),
                // A cluster-scoped object's Events go to `default`, as kube-runtime's do.
                namespace: Some(namespace.unwrap_or("default").to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(ACTION.to_owned()),
            reason: Some(job.reason.as_str().to_owned()),
            type_: Some(job.reason.event_type().to_owned()),
            note: Some(job.note.clone()),
            regarding: Some(ObjectReference {
                api_version: Some(job.objects.api_version.clone()),
                kind: Some(job.objects.kind.clone()),
                namespace: namespace.map(str::to_owned),
                name: Some(name.to_owned()),
                uid,
                ..ObjectReference::default()
            }),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// `namespace/name` (or `name`) as its parts.
fn split(object: &ObjectKey) -> (Option<&str>, &str) {
    match object.as_str().split_once('/') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, object.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use k8s::api::core::v1::ConfigMap;
    use kube_rs::api::{ApiResource, DynamicObject, GroupVersionKind};
    use kube_rs::runtime::{reflector, watcher};

    use super::*;
    use crate::guard::Outcome;
    use crate::monitor::verdict::Action;
    use crate::plug::HangReports;

    fn key(object: &str) -> SeriesKey {
        SeriesKey {
            reason: Reason::Hung,
            controller: "widgets".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            object: ObjectKey::namespaced("ns", object),
        }
    }

    fn repeat(name: &str, count: i32) -> Write {
        Write::Repeat {
            namespace: "ns".into(),
            name: name.into(),
            count,
        }
    }

    #[test]
    fn a_repeat_joins_its_series_until_the_series_goes_quiet_for_six_minutes() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let (a, b) = (key("a"), key("b"));
        assert_eq!(book.next(&a, t0), Write::Create);
        book.created(a.clone(), "ns".into(), "a.1".into(), t0);
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(book.next(&a, t1), repeat("a.1", 2));
        book.repeated(&a, 2, t1);
        // Another object, or another reason on the same object, is another series.
        assert_eq!(book.next(&b, t1), Write::Create);
        let ended = SeriesKey {
            reason: Reason::HangEnded,
            ..a.clone()
        };
        assert_eq!(book.next(&ended, t1), Write::Create);
        // The TTL counts from the series' last write, not its first.
        let t2 = t1 + SERIES_TTL - Duration::from_millis(1);
        assert_eq!(book.next(&a, t2), repeat("a.1", 3));
        book.repeated(&a, 3, t2);
        assert_eq!(book.next(&a, t2 + SERIES_TTL), Write::Create);
        assert!(book.series.is_empty(), "quiet series are forgotten");
    }

    #[test]
    fn a_series_whose_event_is_gone_starts_a_new_event() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let a = key("a");
        book.created(a.clone(), "ns".into(), "a.1".into(), t0);
        book.forget(&a);
        assert_eq!(book.next(&a, t0), Write::Create);
    }

    #[test]
    fn the_warning_about_drops_comes_once_a_minute_with_the_count_since_the_last() {
        let mut warnings = DropWarnings::default();
        let t0 = Instant::now();
        assert_eq!(warnings.dropped(t0), Some(1));
        assert_eq!(warnings.dropped(t0 + Duration::from_secs(1)), None);
        assert_eq!(warnings.dropped(t0 + Duration::from_secs(59)), None);
        assert_eq!(warnings.dropped(t0 + WARN_EVERY), Some(3));
        assert_eq!(warnings.dropped(t0 + WARN_EVERY), None);
    }

    fn report<'a>(reported: Reported, object: &'a ObjectKey) -> HangReport<'a> {
        HangReport {
            reported,
            controller: "widgets",
            kind: "Widget",
            object,
            elapsed: Duration::from_millis(4_125),
            deadline: Duration::from_secs(2),
            state: Some(HangState::Awaiting),
            action: Some(Action::FailLiveness),
            outcome: None,
            waiting: None,
        }
    }

    #[test]
    fn notes_say_what_the_log_says_within_one_kilobyte() {
        let object = ObjectKey::namespaced("ns", "a");
        assert_eq!(
            note(&report(Reported::Hung, &object)),
            "reconcile by widgets has run 4s 125ms, past its 2s deadline; waiting on an await that never woke; failing liveness (restart)"
        );
        let label = HangReport {
            waiting: Some(crate::guard::Waiting::Label("the cert issuer")),
            ..report(Reported::Hung, &object)
        };
        assert_eq!(
            note(&label),
            "reconcile by widgets has run 4s 125ms, past its 2s deadline; waiting on an await that never woke; waiting in the await labelled \"the cert issuer\"; failing liveness (restart)"
        );
        let ended = HangReport {
            state: None,
            action: None,
            outcome: Some(Outcome::Error),
            ..report(Reported::Ended, &object)
        };
        assert_eq!(
            note(&ended),
            "reconcile by widgets ended (error) after 4s 125ms, past its 2s deadline"
        );
        assert!(
            note(&report(Reported::Cancelled, &object)).ends_with("the controller requeues it")
        );
        let long = "é".repeat(NOTE_LIMIT);
        let long = HangReport {
            controller: &long,
            ..report(Reported::StillHung, &object)
        };
        let note = note(&long);
        assert!(
            note.len() <= NOTE_LIMIT && note.len() > NOTE_LIMIT - 2,
            "{}",
            note.len()
        );
    }

    #[test]
    fn reasons_and_types() {
        let of = |r| {
            let reason = Reason::of(r);
            (reason.as_str(), reason.event_type())
        };
        assert_eq!(of(Reported::Hung), ("ReconcileHung", "Warning"));
        assert_eq!(of(Reported::StillHung), ("ReconcileHung", "Warning"));
        assert_eq!(of(Reported::Ended), ("ReconcileHangEnded", "Normal"));
        assert_eq!(of(Reported::Cancelled), ("ReconcileCancelled", "Warning"));
        let failing = Reason::LivenessFailing;
        assert_eq!(
            (failing.as_str(), failing.event_type()),
            ("LivenessFailing", "Warning")
        );
    }

    #[test]
    fn the_pod_s_note_names_the_first_culprits_on_one_line_within_one_kilobyte() {
        for n in [1, 150] {
            let note = liveness_note(&crate::restart::tests::cause(n));
            assert!(note.len() <= NOTE_LIMIT, "{n}: {} bytes", note.len());
            assert!(!note.contains('\n'), "{note}");
            assert!(
                note.contains("; configtemplates default/object-000: ran 6m 40s of a 5m deadline, in-poll, in my_operator::reconcile::take_lock at src/reconcile.rs:42"),
                "{note}"
            );
            assert_eq!(note.ends_with(" more"), n > 1, "{note}");
        }
    }

    #[test]
    fn liveness_failing_goes_to_the_pod_named_by_own_pod_and_nowhere_without_one() {
        use crate::plug::HangReports;
        let events = HangEvents::new("pod-0");
        let cause = crate::restart::tests::cause(1);
        events.liveness_failing(&cause);
        let jobs = events.jobs.lock().unwrap().take().unwrap();
        assert!(jobs.try_recv().is_err(), "an Event without a Pod");
        events.own_pod("ops", "op-7d9", Some("uid-1".into()));
        events.liveness_failing(&cause);
        let job = jobs.try_recv().unwrap().unwrap();
        assert_eq!(job.reason, Reason::LivenessFailing);
        assert_eq!(job.object.as_str(), "ops/op-7d9");
        assert_eq!(
            (job.objects.api_version.as_str(), job.objects.kind.as_str()),
            ("v1", "Pod")
        );
        assert_eq!(
            job.objects
                .uid
                .as_ref()
                .and_then(|uid| uid(Some("ops"), "op-7d9")),
            Some("uid-1".into())
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_unknown_controllers_get_nothing() {
        // Not started: nothing takes from the queue.
        let events = HangEvents::new("pod-0");
        events.controller::<ConfigMap>("configmaps", &(), None);
        let object = ObjectKey::namespaced("ns", "a");
        let mut unknown = report(Reported::Hung, &object);
        unknown.controller = "unregistered";
        for _ in 0..QUEUE * 2 {
            events.reported(&unknown);
        }
        assert_eq!(events.dropped(), 0, "an unknown controller queues nothing");
        let known = HangReport {
            controller: "configmaps",
            ..unknown
        };
        for _ in 0..QUEUE {
            events.reported(&known);
        }
        assert_eq!(events.dropped(), 0);
        events.reported(&known);
        events.reported(&known);
        assert_eq!(events.dropped(), 2);
    }

    fn objects(events: &HangEvents, controller: &str) -> Arc<Objects> {
        let objects = events.objects.read().unwrap();
        Arc::clone(&objects[controller])
    }

    #[test]
    fn the_regarded_object_has_its_controllers_api_version_and_kind_and_its_uid_from_the_cache() {
        let events = HangEvents::new("pod-0");
        // A kind known at run time.
        let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v2", "Widget"));
        events.controller::<DynamicObject>("widgets", &widgets, None);
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let mut configmap = ConfigMap::default();
        configmap.metadata.name = Some("app".into());
        configmap.metadata.namespace = Some("prod".into());
        configmap.metadata.uid = Some("uid-1".into());
        writer.apply_watcher_event(&watcher::Event::Apply(configmap));
        events.controller::<ConfigMap>("configmaps", &(), Some(store));

        let writer = Writer {
            instance: "pod-0".into(),
            stop: Arc::default(),
            drops: Arc::default(),
        };
        let job = |controller: &str, object: ObjectKey| Job {
            reason: Reason::Hung,
            controller: controller.into(),
            object,
            objects: objects(&events, controller),
            note: "a note".into(),
        };
        let widget = job("widgets", ObjectKey::cluster("w"));
        let event = writer.event(&widget, None, "w", None);
        let regarding = event.regarding.clone().unwrap();
        assert_eq!(regarding.api_version.as_deref(), Some("example.com/v2"));
        assert_eq!(regarding.kind.as_deref(), Some("Widget"));
        assert_eq!(
            (regarding.namespace, regarding.name.as_deref()),
            (None, Some("w"))
        );
        // A cluster-scoped object's Events go to `default`.
        assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
        assert!(event.metadata.name.unwrap().starts_with("w."));
        assert_eq!(
            event.reporting_controller.as_deref(),
            Some("reconcile-watchdog")
        );
        assert_eq!(event.reporting_instance.as_deref(), Some("pod-0"));
        assert_eq!(
            (
                event.type_.as_deref(),
                event.reason.as_deref(),
                event.action.as_deref()
            ),
            (Some("Warning"), Some("ReconcileHung"), Some("Reconcile"))
        );
        assert_eq!(event.note.as_deref(), Some("a note"));

        let app = job("configmaps", ObjectKey::namespaced("prod", "app"));
        let uid = app.objects.uid.as_ref().unwrap();
        assert_eq!(uid(Some("prod"), "app").as_deref(), Some("uid-1"));
        assert_eq!(uid(Some("prod"), "gone"), None);
        let event = writer.event(&app, Some("prod"), "app", Some("uid-1".into()));
        let regarding = event.regarding.unwrap();
        assert_eq!(regarding.api_version.as_deref(), Some("v1"));
        assert_eq!(regarding.uid.as_deref(), Some("uid-1"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("prod"));

        let long = "x".repeat(253);
        let name = writer
            .event(&app, Some("prod"), &long, None)
            .metadata
            .name
            .unwrap();
        assert!(name.len() <= 253, "{}", name.len());
    }

    #[test]
    fn object_keys_split_into_namespace_and_name() {
        assert_eq!(split(&ObjectKey::namespaced("ns", "a")), (Some("ns"), "a"));
        assert_eq!(split(&ObjectKey::cluster("a")), (None, "a"));
    }
}
