//! The `reconcile-watchdog` binary's own code: the command line, the `demo` workload and
//! the reference operator of `run`, built on the `reconcile-watchdog` library.
//!
//! Not a library for others: it is a crate of its own so that this repository's tests
//! and fuzz targets reach the binary's parts without making them the library's API.
#![deny(unsafe_code)]
#![warn(missing_docs, rust_2018_idioms, unreachable_pub, clippy::all)]

pub mod cli;
pub mod demo;
pub mod operator;
