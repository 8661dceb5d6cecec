//! Request attribution: the API requests a guarded reconcile sent and still waits on,
//! named by its hang report and its `/debug/reconciles` row.
//!
//! The most common hang of an operator is an API request with no timeout on a
//! half-open connection. A [`RequestLayer`] on the `kube::Client` records each request
//! whose response is first awaited from inside a guarded reconcile on that reconcile's
//! registry entry, with its method, its path (query values left out), when it was sent
//! and whether its response head has come, until the response ends or is dropped.
//! The report then says `waiting on GET /api/v1/namespaces/default/configmaps/x, sent
//! 3s 120ms ago, no response head`.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = kube::Config::infer().await?;
//! let client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&reconcile_watchdog::kube::requests::layer())
//!     .build();
//! # let _ = client; Ok(()) }
//! ```
//!
//! The request is attributed where its response is first awaited, not where it is
//! dispatched: the `kube::Client` hands requests to its own task (a tower buffer), but
//! the reconcile awaits the response itself. Guards publish their reconcile to the
//! thread only once a layer exists, so without one the guard pays nothing for this.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::guard::{Entry, Outgoing, attribute_requests, current_entry};

/// The layer for `kube::client::ClientBuilder::with_layer` that attributes requests to
/// the guarded reconciles that await them; turns attribution on for guards made from
/// now on.
#[must_use]
pub fn layer() -> RequestLayer {
    attribute_requests();
    RequestLayer { _private: () }
}

/// Attributes a `kube::Client`'s requests to guarded reconciles: see [`layer`].
#[derive(Clone, Debug)]
pub struct RequestLayer {
    _private: (),
}

impl<S> tower_layer::Layer<S> for RequestLayer {
    type Service = RequestService<S>;

    fn layer(&self, inner: S) -> RequestService<S> {
        RequestService { inner }
    }
}

/// The service of a [`RequestLayer`].
#[derive(Clone, Debug)]
pub struct RequestService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for RequestService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<RequestBody<ResBody>>;
    type Error = S::Error;
    type Future = RequestFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // This runs on the client's own task: the reconcile is known at the first poll.
        let sent = request
            .uri()
            .path_and_query()
            .map(|path| (request.method().clone(), path.clone()));
        RequestFuture {
            inner: self.inner.call(request),
            sent,
            tracked: None,
        }
    }
}

/// One request recorded on the entry of the reconcile awaiting it; dropping it (the
/// response ended, failed or was dropped) takes the record off.
struct Tracked {
    entry: Weak<Entry>,
    request: Arc<Outgoing>,
}

impl Tracked {
    /// Records the request on the reconcile being polled on this thread, if any.
    fn on_current(method: http::Method, path: http::uri::PathAndQuery) -> Option<Self> {
        let entry = current_entry()?;
        let request = Arc::new(Outgoing::new(method, path, Instant::now()));
        entry.upgrade()?.facts.request_sent(Arc::clone(&request));
        Some(Self { entry, request })
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.upgrade() {
            entry.facts.request_done(&self.request);
        }
    }
}

pin_project! {
    /// The response future of a [`RequestService`].
    pub struct RequestFuture<F> {
        #[pin]
        inner: F,
        sent: Option<(http::Method, http::uri::PathAndQuery)>,
        tracked: Option<Tracked>,
    }
}

impl<F, B, E> Future for RequestFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<RequestBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some((method, path)) = this.sent.take() {
            *this.tracked = Tracked::on_current(method, path);
        }
        let result = ready!(this.inner.poll(cx));
        let tracked = this.tracked.take();
        let response = result?;
        if let Some(tracked) = &tracked {
            tracked.request.head_arrived();
        }
        Poll::Ready(Ok(response.map(|inner| RequestBody { inner, tracked })))
    }
}

pin_project! {
    /// A response body that keeps its request recorded until it ends or is dropped.
    pub struct RequestBody<B> {
        #[pin]
        inner: B,
        tracked: Option<Tracked>,
    }
}

impl<B: Body> Body for RequestBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            // Ended or failed: nothing more to wait on.
            this.tracked.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use bytes::Bytes;
    use futures::channel::oneshot;
    use http_body_util::{BodyExt, Full};
    use tower_layer::Layer;
    use tower_service::Service;

    use super::*;
    use crate::guard::{ObjectKey, Registry, Waiting};

    type Answer = oneshot::Sender<http::Response<Full<Bytes>>>;

    /// A service whose response comes when the test sends it.
    #[derive(Clone)]
    struct Held(Arc<std::sync::Mutex<Vec<Answer>>>);

    impl Service<http::Request<()>> for Held {
        type Response = http::Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let (tx, rx) = oneshot::channel();
            self.0.lock().unwrap().push(tx);
            Box::pin(async move { Ok(rx.await.expect("the test answers")) })
        }
    }

    #[test]
    fn a_request_awaited_in_a_guard_is_named_until_its_body_ends() {
        let held = Held(Arc::default());
        let mut service = layer().layer(held.clone());
        let registry = Registry::new(Duration::from_secs(60));
        let request = http::Request::get(
            "http://api/api/v1/namespaces/default/configmaps/x?fieldManager=secret-value",
        )
        .body(())
        .unwrap();
        // Dispatched outside the reconcile, as kube's buffer task does; awaited inside.
        let response = service.call(request);
        let reconcile = async move {
            let response = response.await.unwrap();
            let body = response.into_body().collect().await.unwrap();
            Ok::<_, ()>(body.to_bytes())
        };
        let mut guarded = pin!(
            registry
                .controller("configtemplates", "ConfigTemplate")
                .guard(ObjectKey::namespaced("default", "x"), reconcile)
        );
        let mut cx = Context::from_waker(Waker::noop());
        assert!(guarded.as_mut().poll(&mut cx).is_pending());

        let seen = registry.snapshot().remove(0);
        let request = seen.request.clone().expect("the request is attributed");
        assert_eq!(request.method, http::Method::GET);
        assert_eq!(
            request.path,
            "/api/v1/namespaces/default/configmaps/x?fieldManager"
        );
        assert!(!request.response_head);
        assert!(matches!(seen.waiting(), Some(Waiting::Request(_))));
        assert!(!seen.no_waker, "the held response holds the waker");

        let answer = held.0.lock().unwrap().pop().unwrap();
        answer
            .send(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
            .unwrap();
        assert!(matches!(
            guarded.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Ok(_)))
        ));
        assert!(registry.is_empty());
    }

    #[test]
    fn a_dropped_request_leaves_the_entry_and_one_outside_a_guard_is_not_recorded() {
        let held = Held(Arc::default());
        let mut service = layer().layer(held.clone());
        let registry = Registry::new(Duration::from_secs(60));
        let mut call = || {
            service.call(
                http::Request::get("http://api/api/v1/namespaces/a/configmaps/b")
                    .body(())
                    .unwrap(),
            )
        };
        let (first, second) = (call(), call());
        let (stop, stopped) = oneshot::channel::<()>();
        let (_never, afterwards) = oneshot::channel::<()>();
        let reconcile = async move {
            futures::future::select(Box::pin(first), stopped).await;
            afterwards.await.ok();
            Ok::<(), ()>(())
        };
        let mut guarded = pin!(
            registry
                .controller("c", "K")
                .guard(ObjectKey::cluster("b"), reconcile)
        );
        let mut cx = Context::from_waker(Waker::noop());
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        assert!(registry.snapshot()[0].request.is_some());

        // Polled outside any guard: not recorded anywhere.
        let mut second = pin!(second);
        assert!(second.as_mut().poll(&mut cx).is_pending());

        // The reconcile stops waiting for it (a select, a timeout): the request is
        // dropped, and its record with it.
        stop.send(()).unwrap();
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        let seen = registry.snapshot().remove(0);
        assert_eq!(seen.request, None);
        assert_eq!(seen.waiting(), None);
        let _ = held;
    }
}
