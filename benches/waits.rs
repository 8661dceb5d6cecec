//! Criterion benches of what saying where a reconcile waits costs (issue 22): a guarded
//! poll that publishes its reconcile to the thread beside one that does not; an API
//! request through the attribution layer inside a guarded reconcile beside the same
//! request bare; and a labelled await beside a bare one.

mod support;

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use criterion::{Criterion, criterion_group, criterion_main};
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

fn waits(c: &mut Criterion) {
    let registry = Registry::new(support::DEADLINE);
    let handle = registry.controller("configmaps", "ConfigMap");
    let object = ObjectKey::namespaced("default", "app");
    let mut group = c.benchmark_group("waits");

    // Before any request layer exists, guards do not publish their reconcile.
    let yield_once = || drive(handle.guard(object.clone(), NoOp::new(Shape::YieldOnce)));
    group.bench_function("poll/unpublished", |b| b.iter(|| black_box(yield_once())));
    let mut attributed = requests::layer().layer(Server);
    group.bench_function("poll/published", |b| b.iter(|| black_box(yield_once())));

    group.bench_function("request/bare", |b| {
        b.iter(|| reconcile_with_request(&handle, &object, &mut Server));
    });
    group.bench_function("request/attributed", |b| {
        b.iter(|| reconcile_with_request(&handle, &object, &mut attributed));
    });

    group.bench_function("await/bare", |b| {
        b.iter(|| {
            black_box(drive(handle.guard(object.clone(), async {
                NoOp::new(Shape::YieldOnce).await
            })))
        });
    });
    group.bench_function("await/labelled", |b| {
        b.iter(|| {
            black_box(drive(handle.guard(object.clone(), async {
                reconcile_watchdog::label(
                    "waiting for the cert issuer",
                    NoOp::new(Shape::YieldOnce),
                )
                .await
            })))
        });
    });
    group.finish();
    assert!(registry.is_empty());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3));
    targets = waits
}
criterion_main!(benches);
