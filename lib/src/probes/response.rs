//! The pieces every server here builds its routes from: filters for the method, the
//! query and the path, and the plain-text answers (404, 405, HEAD without a body) in
//! the conventions of kube-apiserver.

use std::convert::Infallible;

use warp::http::{Method, Response, StatusCode, header};
use warp::{Filter, Rejection};

/// GET or HEAD.
pub(crate) fn get_or_head() -> impl Filter<Extract = (), Error = Rejection> + Copy {
    warp::get().or(warp::head()).unify()
}

/// The raw query string ("" when there is none). Not `warp::query`: it cannot read a
/// repeated key (`?exclude=a&exclude=b`) or a key without a value (`?verbose`).
pub(crate) fn raw_query() -> impl Filter<Extract = (String,), Error = Infallible> + Copy {
    warp::query::raw().or(warp::any().map(String::new)).unify()
}

/// Rejects a path that ends with `/`, which `warp::path::end` lets through: the
/// servers here answer `/metrics`, not `/metrics/`.
pub(crate) fn no_trailing_slash() -> impl Filter<Extract = (), Error = Rejection> + Copy {
    warp::path::full()
        .and_then(|path: warp::path::FullPath| {
            std::future::ready(if path.as_str().ends_with('/') {
                Err(warp::reject::not_found())
            } else {
                Ok(())
            })
        })
        .untuple_one()
}

/// `routes` as a server here answers: their answer; 405 for a path of `paths` asked
/// with another method; for every other request the 404 of kube-apiserver, never a
/// rejection of warp's; and HEAD with GET's status and headers but no body.
pub(crate) fn with_fallbacks<R, P>(
    routes: R,
    paths: P,
) -> impl Filter<Extract = (Response<String>,), Error = Infallible> + Clone + Send + Sync
where
    R: Filter<Extract = (Response<String>,), Error = Rejection> + Clone + Send + Sync,
    P: Filter<Extract = (), Error = Rejection> + Clone + Send + Sync,
{
    warp::method()
        .and(
            routes
                .or(paths.map(method_not_allowed))
                .unify()
                .or(warp::any().map(not_found))
                .unify(),
        )
        .map(|method: Method, response| head_without_body(&method, response))
}

/// GET's answer, without its body when the method is HEAD (status and headers stay).
pub(crate) fn head_without_body(
    method: &Method,
    mut response: Response<String>,
) -> Response<String> {
    if method == Method::HEAD {
        response.body_mut().clear();
    }
    response
}

/// 404, worded as kube-apiserver words it.
pub(crate) fn not_found() -> Response<String> {
    text(StatusCode::NOT_FOUND, "404 page not found\n".into())
}

/// 405, with the methods that are allowed.
pub(crate) fn method_not_allowed() -> Response<String> {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed\n".into(),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
    response
}

/// A plain-text response with the headers every probe answer carries.
pub(crate) fn text(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    response
}
