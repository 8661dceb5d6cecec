//! Build script: compresses the release binary's debug sections when it is linked.
//!
//! The release profile keeps debug info for this workspace's crates (`debug =
//! "limited"`: functions and line tables, no types) so that hang reports name function,
//! file and line; zlib-compressed, they take about a third of the space. The shipped layout
//! (`tools/ship-symbols.sh`) converts them into a GSYM symbol file, which
//! `llvm-gsymutil` makes from zlib sections, and strips them from the binary. Debug
//! builds are left alone: compressing their full debug info would slow every test
//! binary's link.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let elf = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if release && elf {
        println!("cargo::rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
        // lld compresses harder and merges string tails at -O2 (37.3 -> 35.8 MB);
        // GNU ld accepts it too.
        println!("cargo::rustc-link-arg-bins=-Wl,-O2");
    }
}
