//! Criterion benches of what saying where a reconcile waits costs: a guarded
//! poll that publishes its reconcile to the thread beside one that does not; an API
//! request through the attribution layer inside a guarded reconcile beside the same
//! request bare; and a labelled await beside a bare one.

// Only the no-op reconcile and its driver are used here.
#[allow(dead_code)]
mod support;

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use criterion::{Criterion, criterion_group};
use http_body::{Body, Frame};
use reconcile_watchdog::guard::{ControllerHandle, ObjectKey, Registry};
use reconcile_watchdog::kube::requests;
use support::{NoOp, Shape, drive};
use tower_layer::Layer;
use tower_service::Service;

/// A body of one small frame, as the answer to a GET of one object.
struct OneFrame(bool);

impl Body for OneFrame {
    type Data = &'static [u8];
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Poll::Ready(
            std::mem::take(&mut self.0).then(|| Ok(Frame::data(&b"{\"kind\":\"ConfigMap\"}"[..]))),
        )
    }
}

/// A server that answers every request at once.
#[derive(Clone)]
struct Server;

impl Service<http::Request<()>> for Server {
    type Response = http::Response<OneFrame>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<http::Response<OneFrame>, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(OneFrame(true))))
    }
}

const PATH: &str = "/api/v1/namespaces/default/configmaps/app";

/// One guarded reconcile that sends one request through `service` and reads the
/// response to its end.
fn reconcile_with_request<S, B>(handle: &ControllerHandle, object: &ObjectKey, service: &mut S)
where
    S: Service<http::Request<()>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body + Unpin,
{
    let response = service.call(http::Request::get(PATH).body(()).expect("a request"));
    let reconcile = async move {
        let mut body = response.await.expect("answered").into_body();
        let mut frames = 0_u32;
        while let Some(Ok(_)) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frames += 1;
        }
        Ok::<_, ()>(frames)
    };
    assert_eq!(drive(handle.guard(object.clone(), reconcile)), Ok(Ok(1)));
}

/// One reconcile of each case, by name.
struct Cases {
    registry: Registry,
    handle: ControllerHandle,
    object: ObjectKey,
    attributed: Option<requests::RequestService<Server>>,
}

impl Cases {
    fn new() -> Self {
        let registry = Registry::new(support::DEADLINE);
        Self {
            handle: registry.controller("configmaps", "ConfigMap"),
            registry,
            object: ObjectKey::namespaced("default", "app"),
            attributed: None,
        }
    }

    /// Makes the request layer: from now on guards publish their reconcile.
    fn attribute(&mut self) {
        self.attributed = Some(requests::layer().layer(Server));
    }

    fn run(&mut self, case: &str) {
        let (handle, object) = (&self.handle, &self.object);
        match case {
            // A reconcile that awaits once: two polls, published to the thread or not.
            "poll" => {
                let done = drive(handle.guard(object.clone(), NoOp::new(Shape::YieldOnce)));
                assert!(matches!(black_box(done), Ok(Ok(()))));
            }
            "request/bare" => reconcile_with_request(handle, object, &mut Server),
            "request/attributed" => {
                let service = self.attributed.as_mut().expect("attribute() first");
                reconcile_with_request(handle, object, service);
            }
            "await/bare" => {
                let done = drive(
                    handle.guard(object.clone(), async { NoOp::new(Shape::YieldOnce).await }),
                );
                assert!(matches!(black_box(done), Ok(Ok(()))));
            }
            "await/labelled" => {
                let done = drive(handle.guard(object.clone(), async {
                    reconcile_watchdog::label(
                        "waiting for the cert issuer",
                        NoOp::new(Shape::YieldOnce),
                    )
                    .await
                }));
                assert!(matches!(black_box(done), Ok(Ok(()))));
            }
            other => panic!("no case {other}"),
        }
    }
}

fn waits(c: &mut Criterion) {
    let mut cases = Cases::new();
    let mut group = c.benchmark_group("waits");
    // Before any request layer exists, guards do not publish their reconcile.
    group.bench_function("poll/unpublished", |b| b.iter(|| cases.run("poll")));
    cases.attribute();
    group.bench_function("poll/published", |b| b.iter(|| cases.run("poll")));
    for case in [
        "request/bare",
        "request/attributed",
        "await/bare",
        "await/labelled",
    ] {
        group.bench_function(case, |b| b.iter(|| cases.run(case)));
    }
    group.finish();
    assert!(cases.registry.is_empty());
}

/// `count CASE N [published]`: `n` reconciles of one case and nothing else, for
/// callgrind to count instructions (two runs, `n` and `2n`, cancel start-up out); the
/// request cases and `published` make the request layer first.
fn count(args: &[String]) {
    let [case, n, rest @ ..] = args else {
        panic!("usage: count CASE N [published]");
    };
    let mut cases = Cases::new();
    if case.starts_with("request/") || rest.first().is_some_and(|a| a == "published") {
        cases.attribute();
    }
    for _ in 0..n.parse::<u64>().expect("a count") {
        cases.run(case);
    }
    assert!(cases.registry.is_empty());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3));
    targets = waits
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("count") {
        count(&args[1..]);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
