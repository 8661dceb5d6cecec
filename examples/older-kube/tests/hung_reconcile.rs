//! The hand wiring of src/lib.rs, without a cluster: a reconcile that never ends fails
//! the liveness probe, naming its object, once past its deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use older_kube_operator::{guarded, start_watchdog};
use reconcile_watchdog::guard;

/// `GET path` on the probe server: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("the probe server listens");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("a response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    (status, response)
}

#[test]
fn a_hung_reconcile_fails_liveness_naming_its_object() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let watchdog = runtime
        .block_on(async {
            start_watchdog(Duration::from_millis(300), "127.0.0.1:0".parse().unwrap())
        })
        .expect("the watchdog starts");
    let probes = watchdog.probe_address().expect("a probe server");

    // Healthy, with the runtime's heartbeat watched, before anything hangs.
    let started = Instant::now();
    let (status, body) = loop {
        let (status, body) = get(probes, "/healthz?verbose");
        if (status == 200 && body.contains("[+]runtime ok"))
            || started.elapsed() > Duration::from_secs(10)
        {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("[+]runtime ok"),
        "the runtime check is wired: {body}"
    );

    let configmaps = watchdog.registry().controller("configmaps", "ConfigMap");
    let object = ConfigMap {
        metadata: ObjectMeta {
            name: Some("stuck".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    // A reconcile that never ends, as one awaiting a response that never comes.
    let hung = runtime.spawn(async move {
        guarded::<_, (), guard::Error>(&configmaps, &object, std::future::pending()).await
    });

    // Past the 300 ms deadline, within a generous bound: liveness fails, naming it.
    let started = Instant::now();
    let (status, body) = loop {
        let (status, body) = get(probes, "/healthz?verbose");
        if status != 200 || started.elapsed() > Duration::from_secs(20) {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("[-]reconcilers failed: configmaps default/stuck"),
        "the probe names the hung reconcile: {body}"
    );
    assert!(!hung.is_finished());
    hung.abort();
}
