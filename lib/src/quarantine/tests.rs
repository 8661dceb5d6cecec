//! The quarantine's decision, with an injected clock, and the keeper over a store in
//! memory.

use std::time::{Duration, SystemTime};

use super::*;

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000)
}

fn failure(object: &str, uid: &str, generation: i64, at: SystemTime) -> Failure {
    Failure {
        controller: "widgets".into(),
        kind: "Widget".into(),
        object: object.into(),
        uid: Some(uid.into()),
        generation: Some(generation),
        hang: Hang {
            state: "in-poll".into(),
            waiting: None,
            frame: None,
            action: "restart".into(),
        },
        at,
    }
}

fn subject<'a>(object: &'a str, uid: &'a str, generation: i64) -> Subject<'a> {
    Subject {
        controller: "widgets",
        object,
        uid: Some(uid),
        generation: Some(generation),
        lift_asked: false,
    }
}

fn quarantined(since: SystemTime, count: u32) -> Standing {
    Standing::Quarantined {
        since,
        until: since + HOUR,
        count,
    }
}

#[test]
fn n_failures_within_the_window_quarantine_for_the_window_from_the_latest() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    let s = subject("ns/poison", "u1", 1);
    assert_eq!(q.judge(&ledger, &s, t0()), Standing::Free);
    q.record(&mut ledger, failure("ns/poison", "u1", 1, t0()), t0());
    assert_eq!(q.judge(&ledger, &s, t0()), Standing::Free, "one is not two");
    let t1 = t0() + 10 * MINUTE;
    q.record(&mut ledger, failure("ns/poison", "u1", 1, t1), t1);
    assert_eq!(q.judge(&ledger, &s, t1), quarantined(t1, 2));
    // Other objects, and the same name under another controller, are free.
    assert_eq!(
        q.judge(&ledger, &subject("ns/healthy", "u2", 1), t1),
        Standing::Free
    );
    let other = Subject {
        controller: "gadgets",
        ..s
    };
    assert_eq!(q.judge(&ledger, &other, t1), Standing::Free);
    // Until the window from the latest failure is over.
    let almost = t1 + HOUR - Duration::from_secs(1);
    assert_eq!(q.judge(&ledger, &s, almost), quarantined(t1, 2));
    assert_eq!(
        q.judge(&ledger, &s, t1 + HOUR),
        Standing::Lifted {
            why: Lift::Expired,
            latest: Some(t1)
        }
    );
}

#[test]
fn failures_further_apart_than_the_window_do_not_quarantine() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    q.record(&mut ledger, failure("ns/a", "u1", 1, t0()), t0());
    let late = t0() + HOUR + MINUTE;
    q.record(&mut ledger, failure("ns/a", "u1", 1, late), late);
    assert_eq!(
        q.judge(&ledger, &subject("ns/a", "u1", 1), late),
        Standing::Free
    );
    // The stale first failure was pruned; the new one counts as the first.
    assert_eq!(ledger.entries.len(), 1);
    assert_eq!(ledger.entries[0].failures, [late]);
    assert_eq!(ledger.recorded, 2);
}

#[test]
fn after_one_quarantines_at_the_first_failure_and_zero_never() {
    let mut ledger = Ledger::new();
    Quarantine::new(1, HOUR).record(&mut ledger, failure("ns/a", "u1", 1, t0()), t0());
    let s = subject("ns/a", "u1", 1);
    assert_eq!(
        Quarantine::new(1, HOUR).judge(&ledger, &s, t0()),
        quarantined(t0(), 1)
    );
    let off = Quarantine::new(0, HOUR);
    assert!(!off.is_on());
    assert_eq!(off.judge(&ledger, &s, t0()), Standing::Free);
}

#[test]
fn a_new_generation_or_uid_lifts_and_starts_the_count_over() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    let t1 = t0() + MINUTE;
    q.record(&mut ledger, failure("ns/a", "u1", 1, t0()), t0());
    q.record(&mut ledger, failure("ns/a", "u1", 1, t1), t1);
    let lifted = |why| Standing::Lifted {
        why,
        latest: Some(t1),
    };
    assert_eq!(
        q.judge(&ledger, &subject("ns/a", "u1", 2), t1),
        lifted(Lift::SpecChanged)
    );
    // A re-created object is another one, whatever its generation.
    assert_eq!(
        q.judge(&ledger, &subject("ns/a", "u2", 1), t1),
        lifted(Lift::Recreated)
    );
    let by_hand = Subject {
        lift_asked: true,
        ..subject("ns/a", "u1", 1)
    };
    assert_eq!(q.judge(&ledger, &by_hand, t1), lifted(Lift::ByHand));
    // An unknown uid or generation (not in the cache) is not a change.
    let unknown = Subject {
        uid: None,
        generation: None,
        ..subject("ns/a", "u1", 1)
    };
    assert_eq!(q.judge(&ledger, &unknown, t1), quarantined(t1, 2));

    // A failure of the new generation starts its entry over: one, not three.
    let t2 = t1 + MINUTE;
    q.record(&mut ledger, failure("ns/a", "u1", 2, t2), t2);
    assert_eq!(ledger.entries.len(), 1);
    assert_eq!(ledger.entries[0].count, 1);
    assert_eq!(ledger.entries[0].generation, Some(2));
    assert_eq!(
        q.judge(&ledger, &subject("ns/a", "u1", 2), t2),
        Standing::Free
    );
}

#[test]
fn a_quarantine_outlives_the_pruning_of_its_first_failure() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    let t1 = t0() + 50 * MINUTE;
    q.record(&mut ledger, failure("ns/a", "u1", 1, t0()), t0());
    q.record(&mut ledger, failure("ns/a", "u1", 1, t1), t1);
    // Another object's failure prunes the ledger after the first failure's hour.
    let later = t0() + HOUR + 5 * MINUTE;
    q.record(&mut ledger, failure("ns/b", "u2", 1, later), later);
    assert_eq!(
        q.judge(&ledger, &subject("ns/a", "u1", 1), later),
        quarantined(t1, 2)
    );
}

#[test]
fn forgetting_a_lifted_entry_keeps_a_failure_recorded_since() {
    let q = Quarantine::new(1, HOUR);
    let mut ledger = Ledger::new();
    q.record(&mut ledger, failure("ns/a", "u1", 1, t0()), t0());
    let t1 = t0() + MINUTE;
    q.record(&mut ledger, failure("ns/a", "u1", 1, t1), t1);
    assert!(
        !ledger.forget("widgets", "ns/a", Some(t0())),
        "a later failure came"
    );
    assert!(ledger.forget("widgets", "ns/a", Some(t1)));
    assert!(ledger.entries.is_empty());
}

#[test]
fn a_full_ledger_drops_the_entries_whose_latest_failure_is_oldest_and_counts_them() {
    let q = Quarantine::new(1, HOUR).max_objects(3);
    let mut ledger = Ledger::new();
    for i in 0..5u64 {
        let at = t0() + Duration::from_secs(i);
        q.record(&mut ledger, failure(&format!("ns/o{i}"), "u", 1, at), at);
    }
    let mut kept: Vec<_> = ledger.entries.iter().map(|e| e.object.as_str()).collect();
    kept.sort_unstable();
    assert_eq!(kept, ["ns/o2", "ns/o3", "ns/o4"]);
    assert_eq!(ledger.dropped, 2);
    // A failure of a kept one makes it the newest: o2 survives the next.
    let at = t0() + Duration::from_secs(10);
    q.record(&mut ledger, failure("ns/o2", "u", 1, at), at);
    let at = at + Duration::from_secs(1);
    q.record(&mut ledger, failure("ns/o9", "u", 1, at), at);
    let mut kept: Vec<_> = ledger.entries.iter().map(|e| e.object.as_str()).collect();
    kept.sort_unstable();
    assert_eq!(kept, ["ns/o2", "ns/o4", "ns/o9"]);
    assert_eq!(ledger.dropped, 3);
}

#[test]
fn an_entry_keeps_its_latest_times_and_counts_them_all() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    for i in 0..40u64 {
        let at = t0() + Duration::from_secs(i);
        q.record(&mut ledger, failure("ns/a", "u1", 1, at), at);
    }
    let entry = &ledger.entries[0];
    assert_eq!(entry.count, 40);
    assert_eq!(entry.failures.len(), 16);
    assert_eq!(entry.latest(), Some(t0() + Duration::from_secs(39)));
}

#[test]
fn the_ledger_round_trips_and_a_malformed_too_big_or_foreign_one_is_refused() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    q.record(&mut ledger, failure("ns/a", "u1", 3, t0()), t0());
    let bytes = ledger.encode();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(text.contains(r#""object":"ns/a""#), "{text}");
    assert!(text.contains("2026-"), "times are RFC 3339: {text}");
    assert_eq!(Ledger::decode(&bytes).unwrap(), ledger);

    assert!(matches!(
        Ledger::decode(b"{not json"),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        Ledger::decode(br#"{"version":1,"entries":[{"controller":"w"}]}"#),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        Ledger::decode(br#"{"version":7,"entries":[]}"#),
        Err(Error::Version(7))
    ));
    let big = vec![b' '; MAX_LEDGER_BYTES + 1];
    assert!(matches!(Ledger::decode(&big), Err(Error::TooBig { .. })));
}

#[test]
fn how_it_hung_is_kept_bounded() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    let mut long = failure("ns/a", "u1", 1, t0());
    long.hang.waiting = Some("é".repeat(1000));
    q.record(&mut ledger, long, t0());
    let waiting = ledger.entries[0].hang.waiting.as_ref().unwrap();
    assert!(
        waiting.len() <= 256 && waiting.len() > 250,
        "{}",
        waiting.len()
    );
}

#[test]
fn a_frame_captured_after_the_record_completes_the_entry_of_that_failure_only() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    q.record(&mut ledger, failure("ns/a", "u1", 1, t0()), t0());
    let late = |at, frame: &str| LateFrame {
        controller: "widgets".into(),
        object: "ns/a".into(),
        at,
        frame: frame.into(),
    };
    // Of an earlier failure (another hang since): not this hang's frame.
    ledger.late_frame(&late(t0() - MINUTE, "old at src/a.rs:1"));
    assert_eq!(ledger.entries[0].hang.frame, None);
    ledger.late_frame(&late(t0(), &"f".repeat(1000)));
    assert_eq!(
        ledger.entries[0].hang.frame.as_ref().map(String::len),
        Some(256)
    );
    // A frame it has is kept.
    ledger.late_frame(&late(t0(), "later at src/b.rs:2"));
    assert_eq!(
        ledger.entries[0].hang.frame.as_ref().map(String::len),
        Some(256)
    );
    // The next failure of the object is another hang: its own frame, or none.
    let t1 = t0() + MINUTE;
    q.record(&mut ledger, failure("ns/a", "u1", 1, t1), t1);
    assert_eq!(ledger.entries[0].hang.frame, None);
    // Gone from the ledger: nothing to complete, nothing added.
    let mut empty = Ledger::new();
    empty.late_frame(&late(t1, "gone at src/c.rs:3"));
    assert_eq!(empty, Ledger::new());
}

#[test]
fn the_frame_survives_encoding_and_an_entry_without_one_reads_as_before() {
    let q = Quarantine::new(2, HOUR);
    let mut ledger = Ledger::new();
    let mut with = failure("ns/a", "u1", 1, t0());
    with.hang.frame = Some("op::reconcile at src/lib.rs:9".into());
    q.record(&mut ledger, with, t0());
    q.record(&mut ledger, failure("ns/b", "u2", 1, t0()), t0());
    let text = String::from_utf8(ledger.encode()).unwrap();
    assert_eq!(text.matches("\"frame\"").count(), 1, "{text}");
    assert_eq!(Ledger::decode(text.as_bytes()).unwrap(), ledger);
}

mod keeper {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::*;
    use crate::guard::ObjectKey;

    fn eventually(mut condition: impl FnMut() -> bool) {
        let start = Instant::now();
        while !condition() {
            assert!(start.elapsed() < Duration::from_secs(10), "never happened");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stored(bytes: &[u8]) -> Arc<Mutex<Stored>> {
        Arc::new(Mutex::new(Stored {
            bytes: Some(bytes.to_vec()),
            version: Some("1".into()),
        }))
    }

    #[test]
    fn a_malformed_ledger_is_ignored_then_replaced_by_the_next_write() {
        let memory = stored(b"garbage");
        let keeper = Keeper::new(Quarantine::new(1, HOUR));
        keeper
            .start(MemoryStore {
                stored: Arc::clone(&memory),
            })
            .unwrap();
        eventually(|| keeper.shared_loaded());
        assert_eq!(keeper.ledger(), Ledger::new());
        keeper.record_for_test(vec![failure("ns/a", "u1", 1, SystemTime::now())]);
        eventually(|| keeper.writes() == 1);
        let bytes = memory.lock().unwrap().bytes.clone().unwrap();
        let ledger = Ledger::decode(&bytes).unwrap();
        assert_eq!(ledger.entries.len(), 1);
        assert_eq!(keeper.ledger(), ledger);
    }

    #[test]
    fn a_write_that_meets_another_writer_reads_again_and_keeps_both() {
        let q = Quarantine::new(2, HOUR);
        let mut theirs = Ledger::new();
        q.record(
            &mut theirs,
            failure("ns/b", "u2", 1, SystemTime::now()),
            SystemTime::now(),
        );
        let memory = stored(&Ledger::new().encode());
        let keeper = Keeper::new(q);
        // Another replica writes after this one has read: its first write conflicts.
        let racing = RacingStore {
            inner: MemoryStore {
                stored: Arc::clone(&memory),
            },
            theirs: Some(theirs.encode()),
        };
        keeper.start(racing).unwrap();
        eventually(|| keeper.shared_loaded());
        keeper.record_for_test(vec![failure("ns/a", "u1", 1, SystemTime::now())]);
        eventually(|| keeper.writes() == 1);
        let bytes = memory.lock().unwrap().bytes.clone().unwrap();
        let ledger = Ledger::decode(&bytes).unwrap();
        let mut objects: Vec<_> = ledger.entries.iter().map(|e| e.object.clone()).collect();
        objects.sort();
        assert_eq!(objects, ["ns/a", "ns/b"]);
    }

    /// Lets another writer in between this one's read and its first write.
    /// A store whose writes each wait for a word from the test (none once the test
    /// drops its sender), and say so as they start waiting.
    #[derive(Debug)]
    struct GatedStore {
        inner: MemoryStore,
        waiting: std::sync::mpsc::Sender<()>,
        go: std::sync::mpsc::Receiver<()>,
    }

    impl Store for GatedStore {
        fn read(&mut self) -> Result<Stored, StoreError> {
            self.inner.read()
        }

        fn write(&mut self, bytes: &[u8], version: Option<&str>) -> Result<(), StoreError> {
            let _ = self.waiting.send(());
            // Err once the test dropped its sender: every write goes through.
            let _ = self.go.recv();
            self.inner.write(bytes, version)
        }
    }

    #[test]
    fn the_stacks_first_own_frame_is_recorded_with_the_failure_or_when_captured_later() {
        use crate::guard::Registry;
        use crate::monitor::observer::DriverWakes;
        use crate::monitor::verdict::Verdict;
        use crate::monitor::{Config, HangPolicy, Observer, Scan};

        let memory = MemoryStore::default();
        let stored = Arc::clone(&memory.stored);
        let keeper = Keeper::new(Quarantine::new(2, HOUR));
        keeper.start(memory).unwrap();
        eventually(|| keeper.shared_loaded());
        let registry = Registry::new(Duration::from_secs(60));
        let widgets = registry.controller("widgets", "Widget");
        let zero = widgets.clone().with_deadline(Duration::ZERO);
        let _early = zero.register(ObjectKey::namespaced("ns", "early"));
        let _late = zero.register(ObjectKey::namespaced("ns", "late"));
        let mut verdict = Verdict::new(Config {
            policy: HangPolicy::Restart,
            ..Config::default()
        });
        let mut scan = |frames: &[(&str, &str)]| {
            let now = Instant::now();
            let (mut attention, mut counts) = (Vec::new(), Vec::new());
            registry.scan_into(now, false, &mut attention, &mut counts);
            let decision = verdict.step(&attention, registry.take_ended(), None, now);
            let own_frames: Vec<(u64, String)> = frames
                .iter()
                .filter_map(|(object, frame)| {
                    let r = attention.iter().find(|r| r.object.as_str() == *object)?;
                    Some((r.id, (*frame).to_owned()))
                })
                .collect();
            keeper.scanned(&Scan {
                attention: &attention,
                in_flight_by_controller: &counts,
                decision: &decision,
                took: Duration::ZERO,
                runtime_heartbeat_age: None,
                driver_rescues: 0,
                driver_wakes: DriverWakes::default(),
                cause: None,
                own_frames: &own_frames,
            });
        };
        let entry = |object: &str| {
            let bytes = stored.lock().unwrap().bytes.clone()?;
            Ledger::decode(&bytes)
                .ok()?
                .entry("widgets", object)
                .cloned()
        };
        // `early`'s stack was captured by the scan that failed liveness; `late`'s not yet.
        scan(&[("ns/early", "op::lock at src/lock.rs:7")]);
        eventually(|| keeper.writes() == 1);
        let early = entry("ns/early").unwrap();
        assert_eq!(
            early.hang.frame.as_deref(),
            Some("op::lock at src/lock.rs:7")
        );
        assert_eq!(entry("ns/late").unwrap().hang.frame, None);
        // A scan without news writes nothing.
        scan(&[]);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(keeper.writes(), 1);
        // `late`'s stack is captured at a later report: one more write adds its frame,
        // and counts no second failure.
        scan(&[
            ("ns/late", "op::call at src/call.rs:9"),
            ("ns/early", "op::other at src/x.rs:1"),
        ]);
        eventually(|| keeper.writes() == 2);
        let late = entry("ns/late").unwrap();
        assert_eq!(
            late.hang.frame.as_deref(),
            Some("op::call at src/call.rs:9")
        );
        assert_eq!(late.count, 1);
        assert_eq!(
            entry("ns/early").unwrap(),
            early,
            "its frame stays the first one"
        );
        // Once known, the frame is not sent again.
        scan(&[("ns/late", "op::call at src/call.rs:9")]);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(keeper.writes(), 2);
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn the_recorded_failures_metric_is_what_the_ledger_read_says_from_the_first_read() {
        use crate::health::Health;
        use crate::metrics::Metrics;

        let series = |metrics: &Metrics| {
            metrics
                .encode()
                .lines()
                .find(|l| l.starts_with("reconcile_watchdog_quarantine_recorded_failures "))
                .map(str::to_owned)
        };
        let q = Quarantine::new(2, HOUR);
        let mut theirs = Ledger::new();
        for object in ["ns/a", "ns/b", "ns/a"] {
            let now = SystemTime::now();
            q.record(&mut theirs, failure(object, "u1", 1, now), now);
        }
        // Metrics attached before the first read, as the watchdog's builder does.
        let keeper = Keeper::new(q);
        let metrics = Metrics::new(Arc::new(Health::new()));
        keeper.attach_metrics(Arc::clone(&metrics));
        assert_eq!(
            series(&metrics).as_deref(),
            Some("reconcile_watchdog_quarantine_recorded_failures 0")
        );
        keeper
            .start(MemoryStore {
                stored: stored(&theirs.encode()),
            })
            .unwrap();
        eventually(|| keeper.shared_loaded());
        assert_eq!(
            series(&metrics).as_deref(),
            Some("reconcile_watchdog_quarantine_recorded_failures 3")
        );
        // Attached after the read: the same.
        let read_first = Keeper::new(q);
        read_first
            .start(MemoryStore {
                stored: stored(&theirs.encode()),
            })
            .unwrap();
        eventually(|| read_first.shared_loaded());
        let late = Metrics::new(Arc::new(Health::new()));
        read_first.attach_metrics(Arc::clone(&late));
        assert_eq!(
            series(&late).as_deref(),
            Some("reconcile_watchdog_quarantine_recorded_failures 3")
        );
    }

    #[test]
    fn a_full_queue_loses_nothing_once_the_store_answers_again() {
        use std::sync::mpsc;

        let q = Quarantine::new(1, HOUR);
        let memory = stored(&Ledger::new().encode());
        let (waiting_tx, waiting) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let keeper = Keeper::new(q);
        keeper
            .start(GatedStore {
                inner: MemoryStore {
                    stored: Arc::clone(&memory),
                },
                waiting: waiting_tx,
                go: go_rx,
            })
            .unwrap();
        eventually(|| keeper.shared_loaded());
        let now = SystemTime::UNIX_EPOCH
            + Duration::from_secs(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
            );
        // `ns/a` is recorded, so quarantined.
        go.send(()).unwrap();
        assert!(keeper.record_for_test(vec![failure("ns/a", "u1", 1, now)]));
        waiting.recv().unwrap();
        eventually(|| keeper.writes() == 1);
        // The next write waits on the store: the thread holds `ns/b`'s job, and the
        // queue fills behind it until it turns a job away.
        assert!(keeper.record_for_test(vec![failure("ns/b", "u2", 1, now)]));
        waiting.recv().unwrap();
        let mut queued = 0;
        while keeper.record_for_test(vec![failure("ns/c", "u3", 1, now)]) {
            queued += 1;
            assert!(
                queued <= super::super::keeper::QUEUE,
                "the queue never filled"
            );
        }
        assert_eq!(queued, super::super::keeper::QUEUE);
        // A lift while the queue is full: its forgetting is kept aside, as is a reload.
        let mut lift = subject("ns/a", "u1", 1);
        lift.lift_asked = true;
        assert!(matches!(
            keeper.admit(&lift, "Widget", now),
            Admission::Reconcile { lifted: Some(_) }
        ));
        keeper.reload();
        // The store answers again: everything asked lands.
        drop(go);
        eventually(|| {
            keeper.writes() == 3
                && keeper.shared_loaded()
                && memory.lock().unwrap().bytes.as_deref().is_some_and(|b| {
                    Ledger::decode(b).is_ok_and(|l| l.entry("widgets", "ns/a").is_none())
                })
        });
        let bytes = memory.lock().unwrap().bytes.clone().unwrap();
        let ledger = Ledger::decode(&bytes).unwrap();
        assert_eq!(ledger.entry("widgets", "ns/a"), None, "the lift was lost");
        assert_eq!(ledger.entry("widgets", "ns/b").map(|e| e.count), Some(1));
        assert_eq!(
            ledger.entry("widgets", "ns/c").map(|e| e.count),
            Some(u32::try_from(queued).unwrap())
        );
        assert_eq!(ledger.recorded, 2 + queued as u64);
        assert_eq!(keeper.ledger(), ledger);
    }

    #[derive(Debug)]
    struct RacingStore {
        inner: MemoryStore,
        theirs: Option<Vec<u8>>,
    }

    impl Store for RacingStore {
        fn read(&mut self) -> Result<Stored, StoreError> {
            self.inner.read()
        }

        fn write(&mut self, bytes: &[u8], version: Option<&str>) -> Result<(), StoreError> {
            if let Some(theirs) = self.theirs.take() {
                let current = self.inner.read()?.version;
                self.inner.write(&theirs, current.as_deref())?;
            }
            self.inner.write(bytes, version)
        }
    }

    #[test]
    fn admission_announces_a_quarantine_once_and_its_lift_once() {
        let q = Quarantine::new(1, HOUR);
        let since_epoch = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs());
        let mut ledger = Ledger::new();
        q.record(&mut ledger, failure("ns/a", "u1", 1, now), now);
        let memory = stored(&ledger.encode());
        let keeper = Keeper::new(q);
        keeper
            .start(MemoryStore {
                stored: Arc::clone(&memory),
            })
            .unwrap();
        eventually(|| keeper.shared_loaded());
        let s = subject("ns/a", "u1", 1);
        let Admission::Skip { requeue, announced } = keeper.admit(&s, "Widget", now) else {
            panic!("not quarantined");
        };
        assert_eq!(
            requeue,
            Duration::from_secs(60),
            "looked at again within a minute"
        );
        let announced = announced.expect("announced the first time");
        assert_eq!(announced.reason, "ReconcileQuarantined");
        assert!(
            announced.note.contains(LIFT_ANNOTATION),
            "{}",
            announced.note
        );
        assert!(matches!(
            keeper.admit(&s, "Widget", now + MINUTE),
            Admission::Skip {
                announced: None,
                ..
            }
        ));
        assert_eq!(keeper.quarantined(), [("widgets".into(), "ns/a".into())]);
        // Near its end, the requeue is its end.
        let Admission::Skip { requeue, .. } = keeper.admit(&s, "Widget", now + HOUR - MINUTE / 2)
        else {
            panic!("not quarantined");
        };
        assert_eq!(requeue, MINUTE / 2);

        let changed = subject("ns/a", "u1", 2);
        let Admission::Reconcile { lifted: Some(lift) } = keeper.admit(&changed, "Widget", now)
        else {
            panic!("not lifted");
        };
        assert_eq!(lift.reason, "ReconcileQuarantineLifted");
        assert!(lift.note.contains("spec changed"), "{}", lift.note);
        assert_eq!(
            keeper.admit(&s, "Widget", now),
            Admission::Reconcile { lifted: None },
            "a lifted entry is forgotten"
        );
        assert!(keeper.quarantined().is_empty());
        eventually(|| {
            let bytes = memory.lock().unwrap().bytes.clone().unwrap();
            Ledger::decode(&bytes).unwrap().entries.is_empty()
        });
    }

    #[test]
    fn the_failures_of_one_scan_are_one_write() {
        let keeper = Keeper::new(Quarantine::new(2, HOUR));
        keeper.start(MemoryStore::default()).unwrap();
        let now = SystemTime::now();
        let failures = (0..5)
            .map(|i| failure(&format!("ns/o{i}"), "u", 1, now))
            .collect();
        keeper.record_for_test(failures);
        eventually(|| keeper.ledger().entries.len() == 5);
        assert_eq!(keeper.writes(), 1);
        assert_eq!(keeper.ledger().recorded, 5);
    }

    #[test]
    fn the_uid_and_generation_of_a_failure_come_from_its_controller() {
        let keeper = Keeper::new(Quarantine::new(1, HOUR));
        keeper.identify("widgets", |key: &ObjectKey| {
            (key.as_str() == "ns/a").then(|| (Some("uid-a".to_owned()), Some(4)))
        });
        keeper.start(MemoryStore::default()).unwrap();
        let mut unknown = failure("ns/a", "", 0, SystemTime::now());
        (unknown.uid, unknown.generation) = (None, None);
        keeper.record_for_test(vec![unknown]);
        eventually(|| keeper.writes() == 1);
        let entry = keeper.ledger().entries[0].clone();
        assert_eq!(
            (entry.uid.as_deref(), entry.generation),
            (Some("uid-a"), Some(4))
        );
    }
}

#[test]
fn a_reconcile_failing_liveness_is_recorded_once_from_the_monitors_scans() {
    use std::sync::Arc;
    use std::time::Instant;

    let memory = MemoryStore::default();
    let stored = Arc::clone(&memory.stored);
    let keeper = Keeper::new(Quarantine::new(2, HOUR));
    keeper.start(memory).unwrap();
    let watchdog = crate::Watchdog::builder()
        .deadlines(Duration::from_millis(50))
        .interval(Duration::from_millis(10))
        .quarantine(Arc::clone(&keeper))
        .start()
        .unwrap();
    let guard = watchdog
        .registry()
        .controller("widgets", "Widget")
        .register(crate::guard::ObjectKey::namespaced("ns", "stuck"));
    let start = Instant::now();
    while keeper.writes() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "never recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Many more scans see it failing liveness: still one failure.
    std::thread::sleep(Duration::from_millis(200));
    drop(guard);
    let bytes = stored.lock().unwrap().bytes.clone().unwrap();
    let ledger = Ledger::decode(&bytes).unwrap();
    assert_eq!(keeper.writes(), 1);
    assert_eq!(ledger.recorded, 1);
    let entry = &ledger.entries[0];
    assert_eq!(
        (
            entry.controller.as_str(),
            entry.kind.as_str(),
            entry.object.as_str()
        ),
        ("widgets", "Widget", "ns/stuck")
    );
    assert_eq!(entry.hang.state, "awaiting");
    assert_eq!(entry.hang.action, "restart");
    assert_eq!(entry.count, 1);
}

/// What the ledger weighs, for docs/performance.md: `cargo test -p reconcile-watchdog
/// --lib quarantine::tests::ledger_sizes -- --nocapture`.
#[test]
fn ledger_sizes() {
    let q = Quarantine::new(2, HOUR).max_objects(100);
    let realistic = |i: usize, at| {
        Failure {
        controller: "configtemplates".into(),
        kind: "ConfigTemplate".into(),
        object: format!("team-payments-prod/app-config-{i:03}"),
        uid: Some(format!("6f1c2a8e-93b1-4c7e-9d2f-{i:012}")),
        generation: Some(7),
        hang: Hang {
            state: "awaiting".into(),
            waiting: Some(format!(
                "waiting on GET /api/v1/namespaces/team-payments-prod/configmaps/app-config-{i:03}, sent 5m 2s ago, no response head"
            )),
            // Both a request line and a frame: the largest an entry's `hang` gets in
            // practice (a blocked poll has a frame; an await, a request).
            frame: Some(
                "config_operator::render::ConfigRenderer::render_template at src/render/template.rs:214"
                    .into(),
            ),
            action: "restart".into(),
        },
        at,
    }
    };
    let size = |objects: usize, failures_each: u64| {
        let mut ledger = Ledger::new();
        for n in 0..failures_each {
            for i in 0..objects {
                let at = t0() + Duration::from_secs(n);
                q.record(&mut ledger, realistic(i, at), at);
            }
        }
        ledger.encode().len()
    };
    let (one, hundred, full) = (size(1, 1), size(100, 1), size(100, 16));
    eprintln!(
        "ledger: 1 object {one} B; 100 objects {hundred} B; 100 objects with 16 failures each {full} B"
    );
    assert!(one < 1024, "{one}");
    assert!(hundred < 64 * 1024, "{hundred}");
    // The bound the ledger keeps stays well inside what is read, and a ConfigMap's 1 MiB.
    assert!(full < MAX_LEDGER_BYTES / 2, "{full}");
}

#[test]
fn a_reload_reads_what_another_replica_wrote() {
    use std::sync::Arc;
    use std::time::Instant;

    let memory = MemoryStore::default();
    let stored = Arc::clone(&memory.stored);
    let keeper = Keeper::new(Quarantine::new(1, HOUR));
    keeper.start(memory).unwrap();
    let start = Instant::now();
    while !keeper.shared_loaded() {
        assert!(start.elapsed() < Duration::from_secs(10), "never read");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(keeper.ledger().entries.is_empty());
    // The old leader writes after this replica's first read.
    let mut theirs = Ledger::new();
    let now = SystemTime::now();
    Quarantine::new(1, HOUR).record(&mut theirs, failure("ns/a", "u1", 1, now), now);
    MemoryStore {
        stored: Arc::clone(&stored),
    }
    .write(&theirs.encode(), None)
    .unwrap();
    keeper.reload();
    let start = Instant::now();
    while keeper.ledger().entries.is_empty() || !keeper.shared_loaded() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never read again"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(keeper.ledger().entries[0].object, "ns/a");
}
