//! Mass failure: 150 objects whose requests are black-holed at once, and an
//! outage of the whole API server while reconciles are past their deadline.

use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::api::{ListParams, PostParams};
use reconcile_watchdog_operator::operator::ConfigTemplate;
use reconcile_watchdog_operator::operator::crd::ConfigTemplateSpec;
use serde_json::Value;

use super::harness::{Cluster, Operator, SETTLE, eventually, is};

/// The kubelet reads at most 10 KiB of a probe body; the watchdog keeps to 4 KiB.
const BODY_LIMIT: usize = 4096;

/// Creates ConfigTemplates `names` at once.
fn create_all(cluster: &Cluster, names: &[String]) {
    let templates = cluster.templates();
    let created = cluster.runtime.block_on(join_all(names.iter().map(|name| {
        let template = ConfigTemplate::new(
            name,
            ConfigTemplateSpec {
                data: [("name".to_owned(), name.clone())].into(),
            },
        );
        let templates = templates.clone();
        async move { templates.create(&PostParams::default(), &template).await }
    })));
    for (name, result) in names.iter().zip(created) {
        if let Err(error) = result {
            panic!("cannot create ConfigTemplate {name}: {error}");
        }
    }
}

/// The ConfigMaps whose names start with `prefix`.
fn configmaps_named(cluster: &Cluster, prefix: &str) -> usize {
    cluster
        .runtime
        .block_on(cluster.configmaps().list(&ListParams::default()))
        .map(|list| {
            list.items
                .iter()
                .filter(|c| {
                    c.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// `/debug/reconciles` rows whose object's name starts with `prefix`.
fn in_flight_named(operator: &Operator, namespace: &str, prefix: &str) -> Vec<Value> {
    let Some((200, body)) = operator.get_debug("/debug/reconciles") else {
        return Vec::new();
    };
    let rows: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
    let prefix = format!("{namespace}/{prefix}");
    rows.into_iter()
        .filter(|r| r["object"].as_str().is_some_and(|o| o.starts_with(&prefix)))
        .collect()
}

/// The watchdog's ERROR and WARN lines so far.
fn loud_watchdog_lines(operator: &Operator) -> Vec<Value> {
    operator.logged(|e| {
        e["target"] == "reconcile_watchdog::hang" && (e["level"] == "ERROR" || e["level"] == "WARN")
    })
}

#[test]
fn emulator_150_black_holed_objects_keep_probes_and_logs_bounded() {
    const OBJECTS: usize = 150;
    let cluster = Cluster::start("mass");
    cluster.emulator().hold_prefix("mass-");
    let names: Vec<String> = (0..OBJECTS).map(|i| format!("mass-{i:03}")).collect();
    let created = Instant::now();
    create_all(&cluster, &names);
    eprintln!(
        "created {OBJECTS} ConfigTemplates in {:?}",
        created.elapsed()
    );

    let deadline = Duration::from_secs(2);
    let operator_started = Instant::now();
    let operator = Operator::start(&cluster, deadline, &[]);
    let ns = cluster.namespace.clone();
    assert!(
        eventually(SETTLE, || {
            let rows = in_flight_named(&operator, &ns, "mass-");
            rows.len() == OBJECTS && rows.iter().all(|r| r["overdue"] == true)
        }),
        "not every black-holed reconcile was in flight and overdue"
    );
    let all_overdue = Instant::now();
    // A scan or two after every one is overdue, the liveness reason counts them all.
    let mut body = String::new();
    assert!(
        eventually(SETTLE, || {
            body = operator
                .get("/healthz?verbose")
                .map(|(_, b)| b)
                .unwrap_or_default();
            body.contains(&format!(
                "and {} more: configtemplates awaiting {}",
                OBJECTS - 5,
                OBJECTS - 5
            ))
        }),
        "the body never counted the rest: {body}"
    );
    for path in [
        "/healthz?verbose",
        "/healthz",
        "/healthz/reconcilers",
        "/readyz?verbose",
        "/readyz",
        "/livez?verbose",
    ] {
        let (status, body) = operator.get(path).expect("the probe answers");
        assert!(
            body.len() <= BODY_LIMIT,
            "{path}: {} bytes, over {BODY_LIMIT}: {body}",
            body.len()
        );
        if path.starts_with("/healthz") || path.starts_with("/livez") {
            assert_eq!(status, 500, "{path}: {body}");
        }
    }
    assert!(body.contains("[-]reconcilers failed: "), "{body}");
    assert_eq!(
        body.matches(&format!("{ns}/mass-")).count(),
        5,
        "the oldest five named: {body}"
    );

    // Nothing lost: the summaries count every hang not reported on its own (a later
    // summary may wait for the summary period); reminders come every deadline
    // meanwhile, and must stay in budget too.
    let hung_lines = |loud: &[Value]| -> (usize, u64) {
        let individual = loud
            .iter()
            .filter(|e| is(e, "ERROR", "reconcile hung:"))
            .count();
        let summarised: u64 = loud
            .iter()
            .filter(|e| is(e, "ERROR", "more reconciles hung, beyond the report budget"))
            .filter_map(|e| e["count"].as_u64())
            .sum();
        (individual, summarised)
    };
    assert!(
        eventually(SETTLE, || {
            let (individual, summarised) = hung_lines(&loud_watchdog_lines(&operator));
            individual as u64 + summarised == OBJECTS as u64
        }),
        "reports and summaries never added up to every hang: {:#?}",
        loud_watchdog_lines(&operator)
    );
    let loud = loud_watchdog_lines(&operator);
    let (individual, _) = hung_lines(&loud);
    eprintln!(
        "{} watchdog ERROR/WARN lines for {OBJECTS} hangs held {:?} past the deadline",
        loud.len(),
        all_overdue.elapsed()
    );
    // The burst of 10, and the rate of 6 a minute for hangs that came in later scans.
    let minutes = operator_started.elapsed().as_secs() / 60 + 1;
    let budget = 10 + 6 * minutes as usize;
    assert!(
        individual <= budget,
        "{individual} individual hang reports, over the budget of {budget}"
    );
    assert!(
        loud.len() < 50,
        "{} ERROR/WARN lines for {OBJECTS} hangs: {loud:#?}",
        loud.len()
    );
    // Their Events are the log's per-reconcile lines, so the same budget
    // bounds them: one write (a create, or a series patch) per line at most.
    // (Writes first: each follows its line, so lines read after them are at least as many.)
    let writes = cluster.emulator().event_writes();
    let per_reconcile = loud_watchdog_lines(&operator)
        .iter()
        .filter(|e| is(e, "ERROR", "reconcile hung:") || is(e, "WARN", "reconcile still hung:"))
        .count();
    eprintln!("{writes} Event writes for {per_reconcile} per-reconcile lines");
    assert!(writes > 0, "no hang Event was written");
    assert!(
        usize::try_from(writes).unwrap() <= per_reconcile.min(budget),
        "{writes} Event writes, over {per_reconcile} per-reconcile lines or the budget of {budget}"
    );

    let released = Instant::now();
    cluster.emulator().release_prefix("mass-");
    assert!(
        eventually(SETTLE * 2, || configmaps_named(&cluster, "mass-")
            == OBJECTS),
        "not every object got its ConfigMap after the release"
    );
    assert!(
        eventually(SETTLE, || operator.status("/healthz") == 200),
        "/healthz stayed failed after the release"
    );
    eprintln!(
        "every ConfigMap made and /healthz 200 {:?} after the release",
        released.elapsed()
    );
}

#[test]
fn emulator_api_outage_holds_liveness_and_fails_readiness() {
    let cluster = Cluster::start("outage");
    cluster.emulator().hold_prefix("out-");
    let names: Vec<String> = (0..3).map(|i| format!("out-{i}")).collect();
    create_all(&cluster, &names);
    let deadline = Duration::from_secs(5);
    let operator = Operator::start(
        &cluster,
        deadline,
        &["--api-server-check-interval", "500ms"],
    );
    let ns = cluster.namespace.clone();
    assert!(
        eventually(SETTLE, || in_flight_named(&operator, &ns, "out-").len()
            == names.len()),
        "the held reconciles never started"
    );
    assert!(
        eventually(SETTLE, || operator.status("/readyz") == 200),
        "never ready before the outage"
    );

    // The whole server stops answering while they are in flight.
    cluster.emulator().outage(true);
    let out = Instant::now();
    let mut readyz = String::new();
    assert!(
        eventually(SETTLE, || {
            readyz = operator
                .get("/readyz?verbose")
                .map(|(_, b)| b)
                .unwrap_or_default();
            readyz.contains("[-]api-server failed: the API server does not answer")
        }),
        "/readyz never failed naming the API server: {readyz}"
    );
    assert_eq!(operator.status("/readyz"), 500);
    // Past their deadline, liveness holds: a restart cannot help.
    assert!(
        eventually(SETTLE, || {
            let rows = in_flight_named(&operator, &ns, "out-");
            rows.len() == names.len() && rows.iter().all(|r| r["overdue"] == true)
        }),
        "the held reconciles never went overdue"
    );
    let until = Instant::now() + 4 * Duration::from_millis(250) + Duration::from_secs(2);
    while Instant::now() < until {
        let (status, body) = operator.get("/healthz?verbose").expect("the probe answers");
        assert_eq!(status, 200, "liveness failed during the outage: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        operator.eventually_logged(|e| is(e, "ERROR", "the API server does not answer")),
        "the report never said the API server does not answer"
    );
    let held = operator.logged(|e| is(e, "ERROR", "reconcile hung:"));
    assert!(
        held.iter()
            .all(|e| e["action"] == "the API server does not answer: not restarting"),
        "{held:#?}"
    );
    eprintln!("outage held {:?}; liveness stayed 200", out.elapsed());

    // It answers again, and the held requests with it: both probes recover.
    cluster.emulator().release_prefix("out-");
    cluster.emulator().outage(false);
    assert!(
        eventually(SETTLE, || operator.status("/readyz") == 200),
        "/readyz did not recover"
    );
    assert!(
        eventually(SETTLE, || operator.status("/healthz") == 200),
        "/healthz did not recover"
    );
    assert!(
        eventually(SETTLE, || configmaps_named(&cluster, "out-") == names.len()),
        "the held objects were not reconciled after the outage"
    );
}

#[test]
fn emulator_twelve_hangs_in_a_minute_are_each_named_on_an_error_line() {
    // One object's requests held at a time, each past its deadline for a while, then
    // released: with the report budget's 10 and 6 a minute spent on the hangs and
    // their ends, the later hangs go to summaries, which must still name them.
    const HANGS: usize = 12;
    let cluster = Cluster::start("named");
    let deadline = Duration::from_secs(2);
    let operator = Operator::start(&cluster, deadline, &[]);
    let ns = cluster.namespace.clone();
    let names: Vec<String> = (0..HANGS).map(|i| format!("named-{i:02}")).collect();
    let started = Instant::now();
    for name in &names {
        cluster.emulator().black_hole(name);
        cluster.create(name, None);
        assert!(
            eventually(SETTLE, || operator
                .in_flight(&format!("{ns}/{name}"))
                .iter()
                .any(|r| r["overdue"] == true)),
            "{name} never went overdue"
        );
        std::thread::sleep(Duration::from_secs(1));
        cluster.emulator().release(name);
    }
    eprintln!("{HANGS} hangs in {:?}", started.elapsed());
    let unnamed = |operator: &Operator| -> Vec<String> {
        let errors =
            operator.logged(|e| e["target"] == "reconcile_watchdog::hang" && e["level"] == "ERROR");
        names
            .iter()
            .filter(|name| {
                let object = format!("{ns}/{name}");
                !errors
                    .iter()
                    .any(|e| e["message"].as_str().is_some_and(|m| m.contains(&object)))
            })
            .cloned()
            .collect()
    };
    // A summary waits for its period (15 s) after the previous one.
    assert!(
        eventually(SETTLE * 2, || unnamed(&operator).is_empty()),
        "hangs named on no ERROR line: {:?}\n{:#?}",
        unnamed(&operator),
        loud_watchdog_lines(&operator)
    );
}
