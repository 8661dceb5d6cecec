//! What kube 5's `Config::read_timeout` does, against an API server that accepts
//! connections and then goes silent: the advice of docs/embedding.md ("Request
//! timeouts") checked. With a read timeout, a request with no response head fails
//! after it, and so does a watch that is merely quiet (the timeout is per connection,
//! not per request); without one, both wait. Each measured time is printed.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, WatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The read timeout under test: short, so the test is.
const READ_TIMEOUT: Duration = Duration::from_millis(500);
/// Far more than any timeout here takes to fire, even on a loaded machine.
const GENEROUS: Duration = Duration::from_secs(20);
/// How long a request without a read timeout is watched staying pending.
const WAITED: Duration = Duration::from_secs(2);

/// An API server that reads each request head and then says nothing more: a watch gets
/// its response head (a watch that has started, with no event yet), anything else gets
/// nothing (a black-holed request). Connections stay open.
async fn silent_api_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let request_line = String::from_utf8_lossy(&head);
                if request_line.contains("watch=true") {
                    let started = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                    if socket.write_all(started.as_bytes()).await.is_err() {
                        return;
                    }
                }
                // Hold the connection, silent, until the client gives up on it.
                let _ = socket.read(&mut buf).await;
                std::future::pending::<()>().await;
            });
        }
    });
    url
}

fn api(url: &str, read_timeout: Option<Duration>) -> Api<ConfigMap> {
    let mut config = kube::Config::new(url.parse().expect("a URL"));
    config.read_timeout = read_timeout;
    config.reset_reader_on_write = true;
    let client = kube::Client::try_from(config).expect("a client");
    Api::namespaced(client, "default")
}

#[tokio::test]
async fn a_read_timeout_ends_a_request_with_no_answer_and_cuts_a_quiet_watch_too() {
    let url = silent_api_server().await;
    let configmaps = api(&url, Some(READ_TIMEOUT));

    let began = Instant::now();
    let answer = tokio::time::timeout(GENEROUS, configmaps.get("x"))
        .await
        .expect("the read timeout ends the request");
    let request_ended = began.elapsed();
    assert!(answer.is_err(), "{answer:?}");

    let began = Instant::now();
    let mut watch = configmaps
        .watch(&WatchParams::default(), "0")
        .await
        .expect("the watch starts: its response head came")
        .boxed();
    let item = tokio::time::timeout(GENEROUS, watch.next())
        .await
        .expect("the read timeout cuts the quiet watch");
    let watch_cut = began.elapsed();
    assert!(
        matches!(item, None | Some(Err(_))),
        "no event was sent, yet: {item:?}"
    );
    eprintln!(
        "read timeout {READ_TIMEOUT:?}: the unanswered GET failed after {request_ended:?}, \
         the quiet watch was cut after {watch_cut:?}"
    );
    assert!(request_ended >= READ_TIMEOUT && watch_cut >= READ_TIMEOUT);
}

#[tokio::test]
async fn without_a_read_timeout_a_quiet_watch_lives_and_an_unanswered_request_waits() {
    let url = silent_api_server().await;
    let configmaps = api(&url, None);

    let waiting = tokio::time::timeout(WAITED, configmaps.get("x")).await;
    assert!(waiting.is_err(), "the request ended: {waiting:?}");

    let mut watch = configmaps
        .watch(&WatchParams::default(), "0")
        .await
        .expect("the watch starts")
        .boxed();
    let item = tokio::time::timeout(WAITED, watch.next()).await;
    assert!(item.is_err(), "the quiet watch ended: {item:?}");
    eprintln!("no read timeout: after {WAITED:?} the GET still waits and the watch still lives");
}
