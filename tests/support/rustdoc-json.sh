#!/bin/sh
# rustdoc with its unstable options allowed (RUSTC_BOOTSTRAP), for the JSON output that
# tests/library.sh reads the public API from. Given to cargo as RUSTDOC, so that only
# rustdoc's own process sees the variable: set for cargo, it would reach every build
# script that watches it, and cargo would rebuild the dependency tree it has just checked.
RUSTC_BOOTSTRAP=1 exec rustdoc "$@"
