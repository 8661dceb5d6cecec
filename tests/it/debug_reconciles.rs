//! `GET /debug/reconciles` over HTTP on the debug address: the JSON schema is pinned
//! here, field by field, and must match the table in `docs/operations.md`; the probe
//! port does not serve it.

use crate::support;

use std::future::pending;
use std::time::Duration;

use reconcile_watchdog::Watchdog;
use reconcile_watchdog::guard::{Deadlines, ObjectKey};
use serde_json::Value;

use support::{eventually, get};

/// Every field of a row and its JSON type, as documented.
const SCHEMA: [(&str, &str); 17] = [
    ("controller", "string"),
    ("kind", "string"),
    ("object", "string"),
    ("started", "string"),
    ("elapsed_seconds", "number"),
    ("deadline_seconds", "number"),
    ("overdue", "boolean"),
    ("state", "string"),
    ("polls", "integer"),
    ("last_poll_ago_seconds", "number or null"),
    ("thread", "string or null"),
    ("task_id", "integer or null"),
    ("cancel_requested", "boolean"),
    ("waiting", "string or null"),
    ("request", "object or null"),
    ("label", "string or null"),
    ("no_waker", "boolean"),
];

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn conforms(documented: &str, value: &Value) -> bool {
    let actual = type_of(value);
    documented.split(" or ").any(|t| {
        t == actual
            // A whole number of seconds is still a number.
            || (t == "number" && actual == "integer")
    })
}

/// The field table under the `/debug/reconciles` heading of docs/operations.md.
fn documented_schema() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md");
    let doc = std::fs::read_to_string(path).expect("docs/operations.md exists");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("`/debug/reconciles`"))
        .expect("docs/operations.md has a `/debug/reconciles` section");
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line
                .trim()
                .strip_prefix('|')?
                .split('|')
                .map(str::trim)
                .collect();
            let field = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((field.to_owned(), cells.get(1)?.to_string()))
        })
        .collect()
}

#[test]
fn the_documented_table_is_the_pinned_schema() {
    let pinned: Vec<(String, String)> = SCHEMA
        .iter()
        .map(|(f, t)| ((*f).to_owned(), (*t).to_owned()))
        .collect();
    assert_eq!(documented_schema(), pinned);
}

#[test]
fn debug_reconciles_serves_the_pinned_schema_sorted_overdue_first() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let watchdog = Watchdog::builder()
        .deadlines(Deadlines::new(Duration::from_secs(3600)).with("late", Duration::from_millis(1)))
        .probe_address("127.0.0.1:0".parse().unwrap())
        .debug_address("127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap())
        .start()
        .unwrap();
    let addr = watchdog.debug_address().expect("a debug server");
    let probes = watchdog.probe_address().unwrap();
    assert_eq!(get(probes, "/debug/reconciles").status, 404);
    let registry = watchdog.registry();

    // Overdue and never polled: the nullable fields are null.
    let _late = registry
        .controller("late", "Job")
        .register(ObjectKey::namespaced("batch", "nightly"));
    // On time, polled once on a runtime worker and now awaiting: they are set.
    runtime.spawn(registry.controller("waiter", "ConfigMap").guard(
        ObjectKey::namespaced("default", "app"),
        pending::<Result<(), ()>>(),
    ));
    std::thread::sleep(Duration::from_millis(20));
    // On time, started last: sorted after the older on-time one.
    let _young = registry
        .controller("young", "Secret")
        .register(ObjectKey::cluster("fresh"));

    let rows = eventually(Duration::from_secs(30), "three rows, one polled", || {
        let response = get(addr, "/debug/reconciles");
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(response.header("x-reconciles-in-flight"), Some("3"));
        let rows: Vec<Value> = serde_json::from_str(&response.body)
            .unwrap_or_else(|e| panic!("not a JSON array ({e}): {}", response.body));
        let polled = rows.iter().any(|r| r["polls"].as_u64() >= Some(1));
        (rows.len() == 3 && polled).then_some(rows)
    });

    for row in &rows {
        let object = row.as_object().expect("each row is an object");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        let mut fields: Vec<&str> = SCHEMA.iter().map(|(f, _)| *f).collect();
        keys.sort_unstable();
        fields.sort_unstable();
        assert_eq!(keys, fields, "{row}");
        for (field, documented) in SCHEMA {
            assert!(
                conforms(documented, &row[field]),
                "{field} is not {documented}: {row}"
            );
        }
        assert!(
            ["awaiting", "in-poll"].contains(&row["state"].as_str().unwrap()),
            "{row}"
        );
        let started = row["started"].as_str().unwrap();
        assert!(started.ends_with('Z'), "{started}");
        humantime::parse_rfc3339(started).unwrap_or_else(|e| panic!("{started}: {e}"));
        assert_eq!(row["cancel_requested"], false);
    }

    let objects: Vec<&str> = rows.iter().map(|r| r["object"].as_str().unwrap()).collect();
    assert_eq!(
        objects,
        ["batch/nightly", "default/app", "fresh"],
        "overdue first, then oldest"
    );
    let (late, waiter, young) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!(
        (late["overdue"].as_bool(), waiter["overdue"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(late["controller"], "late");
    assert_eq!(late["kind"], "Job");
    assert_eq!(late["deadline_seconds"].as_f64(), Some(0.001));
    for field in ["last_poll_ago_seconds", "thread", "task_id"] {
        assert!(late[field].is_null(), "never polled: {field} is null");
        assert!(!waiter[field].is_null(), "polled: {field} is set");
    }
    assert_eq!(waiter["state"], "awaiting");
    assert_eq!(waiter["deadline_seconds"].as_f64(), Some(3600.0));
    assert!(waiter["elapsed_seconds"].as_f64() >= young["elapsed_seconds"].as_f64());
    runtime.shutdown_background();
}

#[test]
fn no_debug_server_unless_asked_for() {
    let watchdog = Watchdog::builder()
        .probe_address("127.0.0.1:0".parse().unwrap())
        .start()
        .unwrap();
    assert_eq!(watchdog.debug_address(), None);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = Watchdog::builder().debug_address(addr).start().unwrap_err();
    assert_eq!(err.to_string(), "failed to start the debug server");
}
