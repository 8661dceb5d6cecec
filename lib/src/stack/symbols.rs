//! Gives back the memory of symbolization once a scan's stacks are resolved.
//!
//! The symbolizer (the backtrace crate) keeps each binary's parsed debug info in a
//! process-wide cache. A release binary's debug sections are compressed, so that cache
//! holds them inflated: about 190 MB for this repository's binary, kept for the life of
//! the process after its first stack, and more for an operator with a larger binary. A
//! pod with a 256 MiB limit could be OOM-killed at the moment its hang is diagnosed. Hang
//! reports are rare, so the cache is dropped after each scan that resolved a stack, and
//! the allocator is asked to return the freed pages: a later stack pays for parsing
//! again (docs/performance.md has the figures) instead of the pod holding the memory.
#![allow(unsafe_code)]

/// Drops the symbolizer's cache and returns the freed heap to the kernel.
pub(super) fn release() {
    backtrace::clear_symbol_cache();
    trim_heap();
}

/// Returns the free memory at the top of every malloc arena to the kernel (glibc keeps
/// it otherwise: the cache's many small blocks are not mmapped one by one).
#[cfg(target_env = "gnu")]
fn trim_heap() {
    // SAFETY: malloc_trim takes no pointer and may be called from any thread at any
    // time outside a signal handler; it takes each arena's lock as malloc does.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// musl returns freed memory as it goes; other allocators are not told.
#[cfg(not(target_env = "gnu"))]
fn trim_heap() {}
