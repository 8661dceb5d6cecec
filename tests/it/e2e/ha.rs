//! High availability: two or three `run --leader-elect` processes against one API server, with
//! short timings (lease 4s, renew deadline 3s, retry period 1s). Exactly one leads and
//! reconciles; the other is ready and writes nothing; a frozen, stopped or cut-off
//! leader hands over. The measured hand-over times are printed.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::Api;
use serde_json::Value;

use super::harness::{Cluster, Operator, SETTLE, eventually, is};
use crate::support::BIN;

const LEASE: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_secs(1);
/// On top of each bound: the machine runs the other tests and four engineers' builds.
const SLACK: Duration = Duration::from_secs(4);
const LEASE_NAME: &str = "ha-lease";

fn start(cluster: &Cluster) -> Operator {
    let namespace = cluster.namespace.clone();
    Operator::start(
        cluster,
        Duration::from_secs(30),
        &[
            "--leader-elect",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=1s",
            &format!("--leader-elect-resource-name={LEASE_NAME}"),
            &format!("--leader-elect-resource-namespace={namespace}"),
        ],
    )
}

/// The identity `operator` campaigns as, from its first log line about the lease.
fn identity(operator: &Operator) -> String {
    let mut found = None;
    eventually(SETTLE, || {
        found = operator
            .logged(|e| is(e, "INFO", "campaigning for the lease"))
            .first()
            .and_then(|e| e["identity"].as_str().map(str::to_owned));
        found.is_some()
    });
    found.expect("the operator never said which identity it campaigns as")
}

fn leads(operator: &Operator) -> bool {
    !operator
        .logged(|e| is(e, "INFO", "acquired the lease"))
        .is_empty()
}

/// Waits until exactly one of `operators` leads; returns its index.
fn leader_of(operators: &[&Operator]) -> usize {
    assert!(
        eventually(SETTLE, || operators.iter().any(|o| leads(o))),
        "nobody acquired the lease"
    );
    let leading: Vec<usize> = (0..operators.len())
        .filter(|i| leads(operators[*i]))
        .collect();
    assert_eq!(leading.len(), 1, "more than one leader: {leading:?}");
    leading[0]
}

/// The ConfigMap writes `operator` logged (the reference operator logs each one).
fn writes(operator: &Operator) -> Vec<Value> {
    operator.logged(|e| {
        e["message"]
            .as_str()
            .is_some_and(|m| m == "created the ConfigMap" || m == "updated the ConfigMap")
    })
}

/// Whether `operator` ever started its controllers (their stores synced).
fn ran_controllers(operator: &Operator) -> bool {
    !operator
        .logged(|e| is(e, "INFO", "every controller's store has synced"))
        .is_empty()
}

/// The resourceVersion of every ConfigTemplate and ConfigMap: any write to one changes
/// it (Lease renewals do not count).
fn versions(cluster: &Cluster) -> BTreeMap<String, String> {
    cluster.runtime.block_on(async {
        let params = kube::api::ListParams::default();
        let mut versions = BTreeMap::new();
        for t in cluster.templates().list(&params).await.expect("list").items {
            let name = format!("ConfigTemplate/{}", t.metadata.name.unwrap_or_default());
            versions.insert(name, t.metadata.resource_version.unwrap_or_default());
        }
        for c in cluster
            .configmaps()
            .list(&params)
            .await
            .expect("list")
            .items
        {
            let name = format!("ConfigMap/{}", c.metadata.name.unwrap_or_default());
            versions.insert(name, c.metadata.resource_version.unwrap_or_default());
        }
        versions
    })
}

/// The objects' versions once nobody has written for two seconds.
fn settled(cluster: &Cluster) -> BTreeMap<String, String> {
    let mut last = versions(cluster);
    let mut since = Instant::now();
    assert!(
        eventually(SETTLE, || {
            let now = versions(cluster);
            if now != last {
                (last, since) = (now, Instant::now());
            }
            since.elapsed() >= Duration::from_secs(2)
        }),
        "the objects never stopped changing"
    );
    last
}

/// The Lease's holder, read by the test's own client.
fn holder(cluster: &Cluster) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    cluster
        .runtime
        .block_on(leases.get_opt(LEASE_NAME))
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

#[test]
fn ha_one_leader_reconciles_and_a_frozen_leader_hands_over() {
    let cluster = Cluster::start("ha_frozen");
    cluster.create("first", None);
    let a = start(&cluster);
    let b = start(&cluster);
    let ids = [identity(&a), identity(&b)];
    let both = [&a, &b];
    let l = leader_of(&both);
    let (leader, follower) = (both[l], both[1 - l]);
    let (leader_id, follower_id) = (&ids[l], &ids[1 - l]);
    assert!(
        eventually(SETTLE, || cluster.reconciled("first")),
        "the leader did not reconcile"
    );

    // The follower is ready, idle, and says who leads.
    let (status, body) = follower.get("/readyz?verbose").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!(
            "[+]leader-election ok: follower, holder {leader_id}"
        )),
        "{body}"
    );
    let (status, body) = leader.get("/healthz?verbose").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!(
            "[+]leader-election ok: leader, holder {leader_id}, renewed"
        )),
        "{body}"
    );
    assert_eq!(follower.status("/healthz"), 200);
    assert!(
        writes(follower).is_empty() && !ran_controllers(follower),
        "the follower ran its controllers or wrote: {:?}",
        writes(follower)
    );
    assert!(
        ran_controllers(leader),
        "the leader did not sync its stores"
    );
    assert!(!writes(leader).is_empty(), "the leader logged no write");
    assert_eq!(holder(&cluster).as_deref(), Some(leader_id.as_str()));

    // Freeze the leader: the follower takes over within lease + 2 retry periods.
    leader.signal("STOP");
    let frozen = Instant::now();
    cluster.create("second", None);
    assert!(
        eventually(SETTLE, || leads(follower)),
        "the follower never took over from a frozen leader"
    );
    let took = frozen.elapsed();
    eprintln!(
        "hand-over from a frozen leader: {:.1}s (lease {}s, retry {}s)",
        took.as_secs_f64(),
        LEASE.as_secs(),
        RETRY.as_secs()
    );
    assert!(
        took <= LEASE + 2 * RETRY + SLACK,
        "the follower took over {took:?} after the freeze"
    );
    assert!(
        eventually(SETTLE, || cluster.reconciled("second")),
        "the new leader did not reconcile a new object"
    );
    assert!(
        writes(follower)
            .iter()
            .any(|e| e["object"] == format!("{}/second", cluster.namespace)),
        "the new leader did not write second's ConfigMap"
    );

    // Thaw the old leader: it finds it lost the lease, writes nothing, exits non-zero.
    let before = settled(&cluster);
    let writes_before = writes(leader).len();
    let mut leader = if l == 0 { a } else { b };
    leader.signal("CONT");
    let status = leader
        .wait_exit(SETTLE)
        .expect("the old leader did not exit after losing the lease");
    assert!(
        !status.success(),
        "the old leader exited with {status}, expected a failure"
    );
    assert_eq!(
        writes(&leader).len(),
        writes_before,
        "the old leader wrote after losing the lease"
    );
    assert_eq!(
        versions(&cluster),
        before,
        "an object was written after the old leader woke up"
    );
    let lost = leader.logged(|e| is(e, "ERROR", "leadership lost"));
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["holder"], follower_id.as_str(), "{:?}", lost[0]);
    assert_eq!(holder(&cluster).as_deref(), Some(follower_id.as_str()));
}

#[test]
fn ha_sigterm_on_the_leader_releases_the_lease_to_a_follower() {
    let cluster = Cluster::start("ha_sigterm");
    cluster.create("app", None);
    let mut three = vec![start(&cluster), start(&cluster), start(&cluster)];
    let l = leader_of(&three.iter().collect::<Vec<_>>());
    let mut leader = three.remove(l);
    let leader_id = identity(&leader);
    let (mut follower, mut spare) = (three.remove(0), three.remove(0));
    assert!(eventually(SETTLE, || cluster.reconciled("app")));

    // A follower's SIGTERM: exit 0, the lease untouched.
    spare.signal("TERM");
    let status = spare
        .wait_exit(SETTLE)
        .expect("a follower did not exit on SIGTERM");
    assert!(status.success(), "a follower exited with {status}");
    assert_eq!(holder(&cluster).as_deref(), Some(leader_id.as_str()));

    leader.signal("TERM");
    let signalled = Instant::now();
    let status = leader
        .wait_exit(SETTLE)
        .expect("the leader did not exit on SIGTERM");
    assert!(status.success(), "the leader exited with {status}");
    assert!(
        !leader
            .logged(|e| is(e, "INFO", "released the lease"))
            .is_empty(),
        "the leader did not release the lease"
    );
    assert!(
        eventually(SETTLE, || leads(&follower)),
        "the follower never took over"
    );
    let took = signalled.elapsed();
    eprintln!(
        "hand-over after SIGTERM: {:.1}s (retry {}s)",
        took.as_secs_f64(),
        RETRY.as_secs()
    );
    assert!(
        took <= 2 * RETRY + SLACK,
        "the follower took over {took:?} after SIGTERM"
    );
    cluster.create("after", None);
    assert!(eventually(SETTLE, || cluster.reconciled("after")));

    // The new leader, alone now, stops as cleanly.
    follower.signal("TERM");
    let status = follower
        .wait_exit(SETTLE)
        .expect("the new leader did not exit on SIGTERM");
    assert!(status.success(), "the new leader exited with {status}");
}

#[test]
fn emulator_ha_black_holed_renewals_are_a_hang_and_the_leader_steps_down() {
    let cluster = Cluster::start("ha_black_hole");
    let mut leader = start(&cluster);
    assert!(eventually(SETTLE, || leads(&leader)), "no leader");
    let lease = format!("{}/{LEASE_NAME}", cluster.namespace);

    cluster.emulator().black_hole(LEASE_NAME);
    let cut = Instant::now();
    assert!(
        leader.eventually_logged(
            |e| is(e, "ERROR", "reconcile hung:") && e["object"] == lease.as_str()
        ),
        "the hung renewal was not reported"
    );
    let hung =
        leader.logged(|e| is(e, "ERROR", "reconcile hung:") && e["object"] == lease.as_str());
    assert_eq!(hung[0]["controller"], "leader-election", "{:?}", hung[0]);
    assert_eq!(hung[0]["kind"], "Lease", "{:?}", hung[0]);
    assert_eq!(hung[0]["state"], "awaiting", "{:?}", hung[0]);

    let status = leader
        .wait_exit(SETTLE)
        .expect("the leader kept running without renewing");
    let took = cut.elapsed();
    eprintln!(
        "leader cut off from its lease stepped down after {:.1}s (lease {}s)",
        took.as_secs_f64(),
        LEASE.as_secs()
    );
    assert!(!status.success(), "{status}");
    // Tolerance defaults to one retry period.
    assert!(
        took <= LEASE + RETRY + SLACK,
        "stepped down {took:?} after the cut"
    );
    assert_eq!(
        leader.logged(|e| is(e, "ERROR", "leadership lost")).len(),
        1
    );
    cluster.emulator().release(LEASE_NAME);
}

#[test]
fn bad_leader_election_flags_exit_2_naming_the_flag() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--leader-elect-retry-period=soon"],
            "--leader-elect-retry-period",
        ),
        (
            &["--leader-elect-lease-duration=0s"],
            "--leader-elect-lease-duration",
        ),
        (
            &[
                "--leader-elect-lease-duration=10s",
                "--leader-elect-renew-deadline=10s",
            ],
            "--leader-elect-renew-deadline",
        ),
        (
            &[
                "--leader-elect-renew-deadline=3s",
                "--leader-elect-retry-period=3s",
            ],
            "--leader-elect-retry-period",
        ),
        (&[], "--leader-elect-resource-namespace"),
    ];
    for (args, flag) in cases {
        let out = Command::new(BIN)
            .args([
                "run",
                "--leader-elect",
                "--health-probe-bind-address=127.0.0.1:0",
            ])
            .args(args)
            .env_remove("POD_NAMESPACE")
            .env(
                "RECONCILE_WATCHDOG_LEADER_ELECT_RESOURCE_NAMESPACE",
                if flag == "--leader-elect-resource-namespace" {
                    ""
                } else {
                    "ops"
                },
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("'{flag} ")), "{args:?}: {stderr}");
    }
}

/// The Lease's renew time, read by the test's own client.
fn renewed_at(cluster: &Cluster) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let lease = cluster
        .runtime
        .block_on(leases.get_opt(LEASE_NAME))
        .ok()??;
    let renew = lease.spec?.renew_time?;
    serde_json::to_string(&renew).ok()
}

#[test]
fn ha_a_reconcile_blocking_its_worker_stops_neither_other_objects_nor_the_lease() {
    let cluster = Cluster::start("ha-blocked");
    let namespace = cluster.namespace.clone();
    let mut operator = Operator::start(
        &cluster,
        Duration::from_secs(60),
        &[
            "--enable-fault-injection",
            "--leader-elect",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=1s",
            &format!("--leader-elect-resource-name={LEASE_NAME}"),
            &format!("--leader-elect-resource-namespace={namespace}"),
        ],
    );
    assert!(
        eventually(SETTLE, || leads(&operator)),
        "the operator never led"
    );
    // Its reconcile wakes on the API's answer (the I/O driver), then parks its worker
    // thread for good.
    cluster.create("blocked", Some("block"));
    assert!(
        operator.eventually_logged(|e| is(e, "WARN", "a reconcile blocked a runtime worker")
            && e["object"]
                .as_str()
                .is_some_and(|o| o.ends_with("/blocked"))),
        "no rescue WARN naming the blocked reconcile"
    );
    // Other objects are reconciled meanwhile, and the lease keeps being renewed.
    let first = renewed_at(&cluster);
    assert!(first.is_some(), "the lease has no renew time");
    let names: Vec<String> = (0..3).map(|i| format!("after-block-{i}")).collect();
    for name in &names {
        cluster.create(name, None);
    }
    for name in &names {
        assert!(
            eventually(SETTLE, || cluster.reconciled(name)),
            "{name} was not reconciled while another reconcile blocked its worker"
        );
    }
    assert!(
        eventually(LEASE + SLACK, || renewed_at(&cluster) != first),
        "the lease was not renewed while a reconcile blocked its worker"
    );
    assert!(leads(&operator));
    assert_eq!(
        operator.wait_exit(Duration::from_millis(100)),
        None,
        "the leader stepped down"
    );
    let stalled = operator.logged(|e| field_contains(e, "runtime stalled"));
    assert!(stalled.is_empty(), "{stalled:#?}");
}

fn field_contains(event: &Value, text: &str) -> bool {
    event["message"].as_str().is_some_and(|m| m.contains(text))
}
