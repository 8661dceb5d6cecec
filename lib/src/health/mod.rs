//! Named health checks, grouped into the liveness and readiness sets the probes serve.
//!
//! A check answers `Ok(())` or `Err(reason)`; the reason is shown by `?verbose`. The
//! watchdog's own checks live in [`crate::monitor`]; this module holds the sets, the
//! always-passing `ping`, and [`Latch`], a readiness gate released once.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// One named health check.
pub trait Check: Send + Sync + 'static {
    /// The name shown in `?verbose` output and used by `?exclude=` and `/healthz/NAME`.
    fn name(&self) -> &str;
    /// `Ok(())` when healthy, otherwise why not.
    fn check(&self) -> Result<(), String>;
    /// Like [`check`](Self::check), with what `?verbose` shows after a passing check's
    /// `ok` (such as a role); none by default.
    fn detail(&self) -> Result<Option<String>, String> {
        self.check().map(|()| None)
    }
}

/// A check made of a name and a closure.
pub struct FnCheck<F> {
    name: String,
    check: F,
}

impl<F> FnCheck<F>
where
    F: Fn() -> Result<(), String> + Send + Sync + 'static,
{
    /// A check called `name` that runs `check`.
    pub fn new(name: impl Into<String>, check: F) -> Self {
        Self {
            name: name.into(),
            check,
        }
    }
}

impl<F> Check for FnCheck<F>
where
    F: Fn() -> Result<(), String> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), String> {
        (self.check)()
    }
}

/// `ping`: passes whenever the probe server answers at all.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ping;

impl Check for Ping {
    fn name(&self) -> &str {
        "ping"
    }

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A readiness gate that starts closed and is released once, explicitly (for example
/// when every informer has synced). It never closes again.
#[derive(Debug)]
pub struct Latch {
    name: String,
    waiting_for: String,
    released: AtomicBool,
}

impl Latch {
    /// A closed latch called `name`; until released it fails with `waiting_for`.
    #[must_use]
    pub(crate) fn new(name: impl Into<String>, waiting_for: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            waiting_for: waiting_for.into(),
            released: AtomicBool::new(false),
        })
    }

    /// Opens the latch for good. Returns false if it was already open.
    pub fn release(&self) -> bool {
        !self.released.swap(true, Ordering::AcqRel)
    }

    /// Whether it has been released.
    #[must_use]
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
}

impl Check for Latch {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), String> {
        if self.is_released() {
            Ok(())
        } else {
            Err(self.waiting_for.clone())
        }
    }
}

/// The check of every latch of one name: passes once each of them that is still held
/// has been released. A latch dropped unreleased (its holder gave up, e.g. controllers
/// dropped on losing a lease) no longer counts.
#[derive(Debug)]
struct Latches {
    name: String,
    latches: Mutex<Vec<Weak<Latch>>>,
}

impl Latches {
    fn join(&self, latch: &Arc<Latch>) {
        let mut latches = self.latches.lock().unwrap_or_else(|p| p.into_inner());
        latches.retain(|l| l.strong_count() > 0);
        latches.push(Arc::downgrade(latch));
    }
}

impl Check for Latches {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), String> {
        let latches = self.latches.lock().unwrap_or_else(|p| p.into_inner());
        latches
            .iter()
            .filter_map(Weak::upgrade)
            .try_for_each(|latch| latch.check())
    }
}

/// `shutdown`: passes until graceful shutdown begins, then fails for good so the pod
/// leaves its Service's endpoints while it drains.
#[derive(Debug, Default)]
pub struct Shutdown {
    begun: AtomicBool,
}

impl Shutdown {
    /// Not shutting down.
    #[must_use]
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Marks the start of graceful shutdown.
    pub fn begin(&self) {
        self.begun.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun.
    #[must_use]
    pub fn has_begun(&self) -> bool {
        self.begun.load(Ordering::Acquire)
    }
}

impl Check for Shutdown {
    fn name(&self) -> &str {
        "shutdown"
    }

    fn check(&self) -> Result<(), String> {
        if self.has_begun() {
            Err("shutting down".into())
        } else {
            Ok(())
        }
    }
}

/// The result of one check within a run of a set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// The check's name.
    pub name: String,
    /// Whether it passed, and why not.
    pub result: Result<(), String>,
    /// It was skipped by `?exclude=`.
    pub excluded: bool,
    /// What a passing check adds after `ok` in `?verbose`.
    pub detail: Option<String>,
}

/// The result of running a set of checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The set's endpoint name (`healthz`, `readyz`).
    pub endpoint: &'static str,
    /// Every check, in the set's order.
    pub checks: Vec<CheckResult>,
    /// Names given to `?exclude=` that match no check.
    pub unknown_excludes: Vec<String>,
}

impl Report {
    /// Whether every check that was not excluded passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.excluded || c.result.is_ok())
    }
}

impl fmt::Display for Report {
    /// The verbose form of kube-apiserver: `[+]name ok`, `[-]name failed: reason`, then
    /// `<endpoint> check passed|failed`. Unlike apiserver, the reason is given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match (&c.result, c.excluded) {
                (_, true) => writeln!(f, "[+]{} excluded: ok", c.name)?,
                (Ok(()), false) => match &c.detail {
                    Some(detail) => writeln!(f, "[+]{} ok: {detail}", c.name)?,
                    None => writeln!(f, "[+]{} ok", c.name)?,
                },
                (Err(reason), false) => writeln!(f, "[-]{} failed: {reason}", c.name)?,
            }
        }
        if !self.unknown_excludes.is_empty() {
            let names: Vec<String> = self
                .unknown_excludes
                .iter()
                .map(|n| format!("{n:?}"))
                .collect();
            writeln!(
                f,
                "warn: some health checks cannot be excluded: no matches for {}",
                names.join(",")
            )?;
        }
        let verdict = if self.passed() { "passed" } else { "failed" };
        writeln!(f, "{} check {verdict}", self.endpoint)
    }
}

/// An ordered set of named checks behind one endpoint.
pub struct Checks {
    endpoint: &'static str,
    checks: RwLock<Vec<Arc<dyn Check>>>,
}

impl fmt::Debug for Checks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checks")
            .field("endpoint", &self.endpoint)
            .field("names", &self.names())
            .finish()
    }
}

impl Checks {
    /// An empty set served at `/<endpoint>`.
    #[must_use]
    pub(crate) fn new(endpoint: &'static str) -> Self {
        Self {
            endpoint,
            checks: RwLock::new(Vec::new()),
        }
    }

    /// The endpoint name, `healthz` or `readyz`.
    #[must_use]
    pub(crate) fn endpoint(&self) -> &'static str {
        self.endpoint
    }

    /// Adds a check. A check with the same name replaces the old one.
    pub fn add(&self, check: Arc<dyn Check>) {
        let mut checks = self.checks.write().unwrap_or_else(|p| p.into_inner());
        match checks.iter_mut().find(|c| c.name() == check.name()) {
            Some(slot) => *slot = check,
            None => checks.push(check),
        }
    }

    /// The names of the checks, in order.
    #[must_use]
    pub(crate) fn names(&self) -> Vec<String> {
        self.list().iter().map(|c| c.name().to_owned()).collect()
    }

    fn list(&self) -> Vec<Arc<dyn Check>> {
        // Copy the list out so that no lock is held while checks run.
        self.checks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs every check, skipping those named in `exclude`.
    #[must_use]
    pub fn run(&self, exclude: &[String]) -> Report {
        let checks = self.list();
        let checks_run = checks
            .iter()
            .map(|c| {
                let excluded = exclude.iter().any(|e| e == c.name());
                let (result, detail) = if excluded {
                    (Ok(()), None)
                } else {
                    match run_with_detail(c.as_ref()) {
                        Ok(detail) => (Ok(()), detail),
                        Err(reason) => (Err(reason), None),
                    }
                };
                CheckResult {
                    name: c.name().to_owned(),
                    result,
                    excluded,
                    detail,
                }
            })
            .collect();
        let mut unknown_excludes: Vec<String> = exclude
            .iter()
            .filter(|e| !checks.iter().any(|c| c.name() == e.as_str()))
            .cloned()
            .collect();
        unknown_excludes.dedup();
        Report {
            endpoint: self.endpoint,
            checks: checks_run,
            unknown_excludes,
        }
    }

    /// Runs the check called `name` alone; None when there is no such check.
    #[must_use]
    pub fn run_one(&self, name: &str) -> Option<Result<(), String>> {
        self.list()
            .iter()
            .find(|c| c.name() == name)
            .map(|c| run_one(c.as_ref()))
    }
}

/// Like [`run_one`], with the detail of a passing check.
fn run_with_detail(check: &dyn Check) -> Result<Option<String>, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check.detail()))
        .unwrap_or_else(|_| Err("check panicked".into()))
}

/// A check that panics fails instead of taking the probe server down.
fn run_one(check: &dyn Check) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check.check()))
        .unwrap_or_else(|_| Err("check panicked".into()))
}

/// The liveness and readiness sets of a process.
#[derive(Debug)]
pub struct Health {
    /// Served at `/healthz` and `/livez`.
    pub liveness: Checks,
    /// Served at `/readyz`.
    pub readiness: Checks,
    /// The `shutdown` readiness check.
    pub shutdown: Arc<Shutdown>,
    /// The readiness checks of [`readiness_latch`](Self::readiness_latch), by name.
    latches: Mutex<Vec<Arc<Latches>>>,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

impl Health {
    /// `ping` in both sets, `shutdown` in readiness.
    #[must_use]
    pub fn new() -> Self {
        let liveness = Checks::new("healthz");
        let readiness = Checks::new("readyz");
        let shutdown = Shutdown::new();
        liveness.add(Arc::new(Ping));
        readiness.add(Arc::new(Ping));
        readiness.add(Arc::clone(&shutdown) as Arc<dyn Check>);
        Self {
            liveness,
            readiness,
            shutdown,
            latches: Mutex::new(Vec::new()),
        }
    }

    /// A closed readiness latch called `name`, for releasing once. Several latches of
    /// one name (two `kube::Controllers` on one health set) make
    /// one check, which passes once every one still held has been released.
    pub fn readiness_latch(&self, name: &str, waiting_for: &str) -> Arc<Latch> {
        let latch = Latch::new(name, waiting_for);
        let mut all = self.latches.lock().unwrap_or_else(|p| p.into_inner());
        match all.iter().find(|l| l.name == name) {
            Some(latches) => latches.join(&latch),
            None => {
                let latches = Arc::new(Latches {
                    name: name.to_owned(),
                    latches: Mutex::new(Vec::new()),
                });
                latches.join(&latch);
                self.readiness.add(Arc::clone(&latches) as Arc<dyn Check>);
                all.push(latches);
            }
        }
        latch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latches_of_one_name_make_one_check_that_waits_for_every_holder() {
        let health = Health::new();
        let first = health.readiness_latch("informer-sync", "first not synced");
        let second = health.readiness_latch("informer-sync", "second not synced");
        let names = health.readiness.names();
        assert_eq!(
            names.iter().filter(|n| *n == "informer-sync").count(),
            1,
            "{names:?}"
        );
        let check = || health.readiness.run_one("informer-sync").unwrap();
        assert_eq!(check(), Err("first not synced".into()));
        assert!(first.release());
        assert_eq!(
            check(),
            Err("second not synced".into()),
            "the second still waits"
        );
        // A holder that gives up unreleased no longer holds readiness back.
        drop(second);
        assert_eq!(check(), Ok(()));
        let third = health.readiness_latch("informer-sync", "third not synced");
        assert!(check().is_err());
        third.release();
        assert_eq!(check(), Ok(()));
    }

    #[test]
    fn verbose_lists_checks_and_reasons() {
        let health = Health::new();
        health
            .liveness
            .add(Arc::new(FnCheck::new("broken", || Err("it broke".into()))));
        let report = health.liveness.run(&[]);
        assert!(!report.passed());
        assert_eq!(
            report.to_string(),
            "[+]ping ok\n[-]broken failed: it broke\nhealthz check failed\n"
        );
    }

    struct Role;

    impl Check for Role {
        fn name(&self) -> &str {
            "role"
        }
        fn check(&self) -> Result<(), String> {
            Ok(())
        }
        fn detail(&self) -> Result<Option<String>, String> {
            Ok(Some("follower, holder pod-a".into()))
        }
    }

    #[test]
    fn verbose_shows_the_detail_of_a_passing_check() {
        let health = Health::new();
        health.readiness.add(Arc::new(Role));
        let text = health.readiness.run(&[]).to_string();
        assert!(
            text.contains("[+]role ok: follower, holder pod-a\n"),
            "{text}"
        );
        assert!(text.contains("[+]ping ok\n"), "{text}");
        let excluded = health.readiness.run(&["role".into()]).to_string();
        assert!(excluded.contains("[+]role excluded: ok\n"), "{excluded}");
    }

    #[test]
    fn exclude_skips_and_warns_on_unknown_names() {
        let health = Health::new();
        health
            .liveness
            .add(Arc::new(FnCheck::new("broken", || Err("it broke".into()))));
        let report = health.liveness.run(&["broken".into(), "nope".into()]);
        assert!(report.passed());
        let text = report.to_string();
        assert!(text.contains("[+]broken excluded: ok\n"), "{text}");
        assert!(
            text.contains("warn: some health checks cannot be excluded: no matches for \"nope\""),
            "{text}"
        );
        assert!(text.ends_with("healthz check passed\n"), "{text}");
    }

    #[test]
    fn latch_releases_once() {
        let health = Health::new();
        let latch = health.readiness_latch("informer-sync", "informers have not synced");
        assert_eq!(
            health.readiness.run_one("informer-sync"),
            Some(Err("informers have not synced".into()))
        );
        assert!(latch.release());
        assert!(!latch.release());
        assert_eq!(health.readiness.run_one("informer-sync"), Some(Ok(())));
        assert_eq!(health.readiness.run_one("missing"), None);
    }

    #[test]
    fn shutdown_fails_readiness_for_good() {
        let health = Health::new();
        assert!(health.readiness.run(&[]).passed());
        health.shutdown.begin();
        let report = health.readiness.run(&[]);
        assert!(!report.passed());
        assert!(
            report
                .to_string()
                .contains("[-]shutdown failed: shutting down")
        );
        assert!(
            health.liveness.run(&[]).passed(),
            "shutdown is not a liveness matter"
        );
    }

    #[test]
    fn a_panicking_check_fails_instead_of_unwinding() {
        let checks = Checks::new("healthz");
        checks.add(Arc::new(FnCheck::new("boom", || panic!("boom"))));
        assert_eq!(checks.run_one("boom"), Some(Err("check panicked".into())));
    }
}
