//! Criterion bench of the watch freshness layer: one body frame of a watch
//! response read through the layer (a clock read and an atomic maximum) beside the same
//! frame read bare, and a request the layer passes over (a GET of one object).

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use http_body::{Body, Frame};
use reconcile_watchdog::Watchdog;
use reconcile_watchdog::kube::watches::{DEFAULT_STALL_THRESHOLD, Watches};
use tower_layer::Layer;
use tower_service::Service;

/// A body of endless one-line frames, like a watch stream of bookmarks.
struct Frames;

impl Body for Frames {
    type Data = &'static [u8];
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Poll::Ready(Some(Ok(Frame::data(&b"{\"type\":\"BOOKMARK\"}\n"[..]))))
    }
}

/// A server that answers every request at once with [`Frames`].
#[derive(Clone)]
struct Server;

impl Service<http::Request<()>> for Server {
    type Response = http::Response<Frames>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<http::Response<Frames>, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(Frames)))
    }
}

fn ready<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the server answers at once"),
    }
}

fn frame<B: Body + Unpin>(body: &mut B) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(body).poll_frame(&mut cx), Poll::Ready(Some(Ok(_))))
}

fn request(path: &str) -> http::Request<()> {
    http::Request::get(path).body(()).expect("a request")
}

fn watch_layer(c: &mut Criterion) {
    let watches = Watches::new(Some(DEFAULT_STALL_THRESHOLD));
    let _watchdog = Watchdog::builder()
        .watches(watches.clone())
        .start()
        .expect("a watchdog");
    watches.expect("configmaps", "configmaps");
    let mut layered = watches.layer().layer(Server);
    let watch = "/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true";

    let mut group = c.benchmark_group("watch_layer");
    let mut bare = ready(Server.call(request(watch)))
        .expect("a response")
        .into_body();
    group.bench_function("frame/bare", |b| b.iter(|| black_box(frame(&mut bare))));
    let mut dated = ready(layered.call(request(watch)))
        .expect("a response")
        .into_body();
    group.bench_function("frame/dated", |b| b.iter(|| black_box(frame(&mut dated))));
    group.bench_function("request/watch", |b| {
        b.iter(|| black_box(ready(layered.call(request(watch)))))
    });
    let object = "/api/v1/namespaces/default/configmaps/app";
    group.bench_function("request/object", |b| {
        b.iter(|| black_box(ready(layered.call(request(object)))))
    });
    group.bench_function("request/bare", |b| {
        b.iter(|| black_box(ready(Server.call(request(object)))))
    });
    group.finish();
    assert!(
        watches
            .ages(std::time::Instant::now())
            .iter()
            .all(|w| w.age.as_secs() < 60)
    );
}

criterion_group!(benches, watch_layer);
criterion_main!(benches);
