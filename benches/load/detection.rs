//! Detection latency: from a reconcile's deadline passing to `/healthz` answering 500.

use std::time::{Duration, Instant};

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::ObjectKey;

use crate::http::Client;

/// The outcome of `hangs` hangs.
pub struct Detection {
    /// The monitor's scan interval.
    pub interval: Duration,
    /// The reconciles' deadline.
    pub deadline: Duration,
    /// Deadline passed to first 500 received, one per hang.
    pub latencies: Vec<Duration>,
}

/// Starts a real watchdog (monitor thread and probe server), then `hangs` times: waits
/// a random part of an interval (so hangs fall anywhere between two scans), registers
/// a reconcile that never finishes, polls `/healthz` until it answers 500, and ends
/// the reconcile and waits for 200 again.
pub fn run(hangs: usize, deadline: Duration, interval: Duration) -> Detection {
    let watchdog = Watchdog::builder()
        .deadlines(deadline)
        .interval(interval)
        .probe_address(([127, 0, 0, 1], 0).into())
        .start()
        .expect("the watchdog starts");
    let addr = watchdog.probe_address().expect("a probe server");
    let handle = watchdog.registry().controller("detection", "ConfigMap");
    let mut client = Client::connect(addr).expect("connect to the probe server");
    wait_for_status(&mut client, 200);

    let interval_us = u64::try_from(interval.as_micros()).expect("a sane interval");
    let mut latencies = Vec::with_capacity(hangs);
    for hang in 0..hangs {
        std::thread::sleep(Duration::from_micros(rand::random_range(0..interval_us)));
        let guard = handle.register(ObjectKey::namespaced("default", &format!("hang-{hang}")));
        let started = watchdog
            .registry()
            .snapshot()
            .into_iter()
            .find(|r| r.id == guard.id())
            .expect("the hang is in flight")
            .started;
        let due = started + deadline;
        loop {
            let status = client.get("/healthz").expect("a /healthz answer");
            let now = Instant::now();
            if status == 500 {
                assert!(now >= due, "/healthz failed before the deadline passed");
                latencies.push(now - due);
                break;
            }
            assert!(
                now < due + Duration::from_secs(10),
                "/healthz still passes 10s after the deadline"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        drop(guard);
        wait_for_status(&mut client, 200);
    }
    Detection {
        interval,
        deadline,
        latencies,
    }
}

fn wait_for_status(client: &mut Client, want: u16) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while client.get("/healthz").expect("a /healthz answer") != want {
        assert!(Instant::now() < give_up, "/healthz never answered {want}");
        std::thread::sleep(Duration::from_micros(200));
    }
}
