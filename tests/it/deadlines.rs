//! Near misses and the deadline advisor end to end: a reconcile that runs 85 % of its
//! deadline is a near miss (one WARN, a count in `/metrics`) and not a hang;
//! `/debug/deadlines` lists the controller with a suggested flag line; and
//! `reconcile-watchdog deadlines --from URL` prints it, or a clear error.

use crate::support;

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::ObjectKey;
use serde_json::Value;
use support::openmetrics;
use support::{BIN, get};

const CONTROLLER: &str = "slow-sync";
const DEADLINE: Duration = Duration::from_secs(2);
/// 85 % of the deadline.
const SLOW: Duration = Duration::from_millis(1_700);
/// Reconciles before the slow one: enough for a suggestion (the advisor needs 100).
const QUICK: u64 = 150;

/// A log sink shared with a tracing subscriber.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    /// The JSON events written so far.
    fn events(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn watchdog(near_miss: Option<f64>) -> Watchdog {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Watchdog::builder()
        .deadlines(DEADLINE)
        .interval(Duration::from_millis(50))
        .near_miss_threshold(near_miss)
        .probe_address(loopback)
        .metrics_address(loopback)
        .debug_address(loopback)
        .start()
        .expect("the watchdog starts")
}

/// Runs `QUICK` quick reconciles and one of `SLOW` on this thread, with the events this
/// thread logs (the guard's end, so the near-miss WARN, runs here) going to the sink.
fn reconcile(watchdog: &Watchdog) -> Sink {
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || writer.clone())
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = watchdog.registry().controller(CONTROLLER, "ConfigMap");
    let probes = watchdog.probe_address().unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            for i in 0..QUICK {
                let key = ObjectKey::namespaced("default", &format!("quick-{i}"));
                let result = handle
                    .guard(key, async { Ok::<_, ()>(()) })
                    .await
                    .expect("not cancelled");
                assert_eq!(result, Ok(()));
            }
            let slow = handle.guard(ObjectKey::namespaced("default", "slow"), async {
                tokio::time::sleep(SLOW).await;
                Ok::<_, ()>(())
            });
            // The probes meanwhile: on time, so healthy throughout.
            let watching = std::thread::spawn(move || {
                let mut statuses = Vec::new();
                for _ in 0..10 {
                    std::thread::sleep(SLOW / 10);
                    statuses.push(get(probes, "/healthz?verbose").status);
                }
                statuses
            });
            assert_eq!(slow.await.expect("not cancelled"), Ok(()));
            let statuses = watching.join().unwrap();
            assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
        });
    });
    sink
}

fn sample(watchdog: &Watchdog, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let body = get(watchdog.metrics_address().unwrap(), "/metrics").body;
    let exposition =
        openmetrics::parse(&body).unwrap_or_else(|e| panic!("invalid OpenMetrics: {e}\n{body}"));
    exposition.value(name, labels)
}

fn deadlines_command(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("deadlines")
        .args(args)
        .env_remove("RECONCILE_WATCHDOG_DEADLINES_FROM")
        .env_remove("RECONCILE_WATCHDOG_DEADLINES_TIMEOUT")
        .output()
        .expect("the binary runs")
}

#[test]
fn a_reconcile_at_85_percent_of_its_deadline_is_a_near_miss_and_gets_a_suggestion() {
    let watchdog = watchdog(Some(0.8));
    let logs = reconcile(&watchdog);

    // One WARN, naming the controller, the object, the duration and the deadline.
    let warns: Vec<Value> = logs
        .events()
        .into_iter()
        .filter(|e| e["target"] == "reconcile_watchdog::near_miss")
        .collect();
    assert_eq!(warns.len(), 1, "{warns:?}");
    let warn = &warns[0];
    assert_eq!(warn["level"], "WARN");
    let fields = &warn["fields"];
    assert_eq!(fields["controller"], CONTROLLER);
    assert_eq!(fields["object"], "default/slow");
    assert_eq!(fields["deadline"], "2s");
    let elapsed = humantime::parse_duration(fields["elapsed"].as_str().unwrap()).unwrap();
    assert!(elapsed >= SLOW && elapsed <= DEADLINE, "{elapsed:?}");
    let message = fields["message"].as_str().unwrap();
    assert!(
        message.starts_with("reconcile near miss: slow-sync default/slow took 1s 7"),
        "{message}"
    );

    // Counted, and no hang.
    let controller = [("controller", CONTROLLER)];
    assert_eq!(
        sample(
            &watchdog,
            "reconcile_watchdog_near_misses_total",
            &controller
        ),
        Some(1.0)
    );
    for state in ["awaiting", "in-poll"] {
        assert_eq!(
            sample(
                &watchdog,
                "reconcile_watchdog_hangs_total",
                &[("controller", CONTROLLER), ("state", state)]
            ),
            Some(0.0),
            "{state}"
        );
    }

    // The advisor's view.
    let debug = watchdog.debug_address().unwrap();
    let response = get(debug, "/debug/deadlines");
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let view: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(view["near_miss_threshold"], "80%");
    let rows = view["controllers"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{view}");
    let row = &rows[0];
    assert_eq!(row["controller"], CONTROLLER);
    assert_eq!(row["deadline"], "2s");
    assert_eq!(row["deadline_source"], "default");
    assert_eq!(row["reconciles"], QUICK + 1);
    assert_eq!(row["near_misses"], 1);
    assert_eq!(row["hangs"], 0);
    assert!(
        row["max_seconds"].as_f64().unwrap() >= SLOW.as_secs_f64(),
        "{row}"
    );
    // p99.9 of 151 is the slow one: 3 x 1.7 s and a little, rounded up the ladder.
    let flag = row["flag"].as_str().unwrap();
    let value = flag
        .strip_prefix(&format!("--reconcile-deadline-for {CONTROLLER}="))
        .unwrap_or_else(|| panic!("{flag}"));
    let suggested = humantime::parse_duration(value).unwrap();
    assert!(
        suggested >= SLOW * 3 && suggested <= Duration::from_secs(8),
        "{flag}"
    );
    assert_eq!(row["suggested_deadline"], value);
    assert!(
        row["reasoning"].as_str().unwrap().contains("too tight"),
        "{row}"
    );

    // The command reads it back into a table and the flag line.
    let output = deadlines_command(&["--from", &format!("http://{debug}")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains(&format!("\n  {flag}\n")), "{stdout}");
    let row_line = stdout
        .lines()
        .find(|l| l.starts_with(CONTROLLER))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row_line.contains(" 151 "), "{row_line}");
    assert!(row_line.ends_with(value), "{row_line}");
}

#[test]
fn off_turns_near_misses_off() {
    let watchdog = watchdog(None);
    let logs = reconcile(&watchdog);
    assert!(
        !logs
            .events()
            .iter()
            .any(|e| e["target"] == "reconcile_watchdog::near_miss"),
        "no WARN"
    );
    assert_eq!(
        sample(
            &watchdog,
            "reconcile_watchdog_near_misses_total",
            &[("controller", CONTROLLER)]
        ),
        Some(0.0)
    );
    let view: Value =
        serde_json::from_str(&get(watchdog.debug_address().unwrap(), "/debug/deadlines").body)
            .unwrap();
    assert_eq!(view["near_miss_threshold"], "off");
    assert_eq!(view["controllers"][0]["near_misses"], 0);
}

#[test]
fn the_command_says_what_went_wrong() {
    // Nothing listens: a refused connection.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let output = deadlines_command(&["--from", &format!("http://127.0.0.1:{port}")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.starts_with(&format!(
            "error: cannot connect to http://127.0.0.1:{port}/debug/deadlines"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("refused"), "{stderr}");

    // An answer that is not the view: /metrics is text, a 404 is a status.
    let watchdog = watchdog(Some(0.8));
    let metrics = watchdog.metrics_address().unwrap();
    let output = deadlines_command(&["--from", &format!("http://{metrics}/metrics")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains("is not the JSON of /debug/deadlines (it begins \"# HELP"),
        "{stderr}"
    );
    let output = deadlines_command(&["--from", &format!("http://{metrics}")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains("/debug/deadlines answered 404 Not Found"),
        "{stderr}"
    );

    // A bad URL is a bad flag: status 2, naming it.
    for bad in ["127.0.0.1:8082", "https://127.0.0.1:8082", "http://"] {
        let output = deadlines_command(&["--from", bad]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad}: {output:?}");
        assert!(stderr.contains("'--from <URL>'"), "{bad}: {stderr}");
    }
    let output = deadlines_command(&[]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn demo_near_misses_reach_the_log_the_view_and_the_command() {
    // Deadline 1 s: every 10th deployment-scaler reconcile takes 850 ms.
    let process = support::Process::demo(&[
        "--hang-kind=none",
        "--reconcile-deadline=1s",
        "--near-miss-every=10",
        "--near-miss-threshold=70%",
        "--duration=60s",
    ]);
    let debug = process.debug_address().expect("a debug server");
    let probes = process.probe_address();
    let row = support::eventually(
        Duration::from_secs(45),
        "a suggestion for deployment-scaler",
        || {
            let view: Value = serde_json::from_str(&get(debug, "/debug/deadlines").body).unwrap();
            assert_eq!(view["near_miss_threshold"], "70%");
            view["controllers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["controller"] == "deployment-scaler" && c["flag"].is_string())
                .cloned()
        },
    );
    assert!(row["near_misses"].as_u64().unwrap() >= 1, "{row}");
    assert_eq!(row["hangs"], 0, "{row}");
    assert_eq!(get(probes, "/healthz").status, 200);
    let warn = support::eventually(Duration::from_secs(10), "a near-miss WARN", || {
        process
            .events()
            .into_iter()
            .find(|e| e["target"] == "reconcile_watchdog::near_miss")
    });
    assert_eq!(warn["level"], "WARN");
    assert_eq!(warn["controller"], "deployment-scaler");
    assert_eq!(warn["deadline"], "1s");

    let output = deadlines_command(&["--from", &format!("http://{debug}")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("\n  --reconcile-deadline-for deployment-scaler="),
        "{stdout}"
    );
    for controller in ["cert-renewer", "configmap-sync", "deployment-scaler"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(controller)),
            "{controller}: {stdout}"
        );
    }
}
