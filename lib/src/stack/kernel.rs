//! What the kernel says a thread is doing, read from `/proc/self/task/<tid>/`.

use std::fmt;
use std::path::PathBuf;

/// A thread's scheduler state, the kernel function it sleeps in and the system call it
/// is blocked in, each where the kernel has it. Reading them needs no privilege: the
/// kernel's ptrace access check, which guards `wchan` and `syscall`, always lets a
/// process look at its own threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelState {
    /// `State:` of `status`, such as `S (sleeping)` or `R (running)`.
    pub(crate) state: Option<String>,
    /// `wchan`: the kernel function a sleeping thread waits in (`0` or unreadable on
    /// kernels that hide it, so absent then).
    pub(crate) wchan: Option<String>,
    /// `syscall`: the system call it is blocked in, by name where known
    /// (`futex`, `clock_nanosleep`), or `running` when it is in user space.
    pub(crate) syscall: Option<String>,
}

impl KernelState {
    /// Reads thread `tid` of this process. Errors only when the thread is gone (or
    /// `/proc` is missing); each field that cannot be read is left out instead.
    pub(crate) fn read(tid: u32) -> Result<Self, super::Error> {
        let dir = PathBuf::from(format!("/proc/self/task/{tid}"));
        let status = std::fs::read_to_string(dir.join("status"))
            .map_err(|source| super::Error::NoSuchThread { tid, source })?;
        let state = status
            .lines()
            .find_map(|line| line.strip_prefix("State:"))
            .map(|s| s.trim().to_owned());
        let wchan = std::fs::read_to_string(dir.join("wchan"))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty() && s != "0");
        let syscall = std::fs::read_to_string(dir.join("syscall"))
            .ok()
            .and_then(|s| describe_syscall(&s));
        Ok(Self {
            state,
            wchan,
            syscall,
        })
    }
}

impl fmt::Display for KernelState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unknown = "unknown";
        write!(
            f,
            "state {}, wchan {}, syscall {}",
            self.state.as_deref().unwrap_or(unknown),
            self.wchan.as_deref().unwrap_or(unknown),
            self.syscall.as_deref().unwrap_or(unknown)
        )
    }
}

/// The first word of `/proc/.../syscall` is the number of the system call the thread
/// is blocked in, `running`, or `-1` (blocked, but not in a system call).
fn describe_syscall(contents: &str) -> Option<String> {
    let first = contents.split_whitespace().next()?;
    let Ok(number) = first.parse::<i64>() else {
        return Some(first.to_owned());
    };
    if number < 0 {
        return Some("none (blocked outside a system call)".to_owned());
    }
    Some(match syscall_name(number) {
        Some(name) => name.to_owned(),
        None => format!("#{number}"),
    })
}

/// The names of the system calls a stuck reconcile is most likely blocked in.
#[cfg(target_os = "linux")]
fn syscall_name(number: i64) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    const ARCH_ONLY: &[(libc::c_long, &str)] = &[
        (libc::SYS_poll, "poll"),
        (libc::SYS_select, "select"),
        (libc::SYS_epoll_wait, "epoll_wait"),
        (libc::SYS_nanosleep, "nanosleep"),
    ];
    #[cfg(not(target_arch = "x86_64"))]
    const ARCH_ONLY: &[(libc::c_long, &str)] = &[];
    const COMMON: &[(libc::c_long, &str)] = &[
        (libc::SYS_futex, "futex"),
        (libc::SYS_clock_nanosleep, "clock_nanosleep"),
        (libc::SYS_epoll_pwait, "epoll_pwait"),
        (libc::SYS_ppoll, "ppoll"),
        (libc::SYS_pselect6, "pselect6"),
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_recvfrom, "recvfrom"),
        (libc::SYS_sendto, "sendto"),
        (libc::SYS_connect, "connect"),
        (libc::SYS_accept4, "accept4"),
        (libc::SYS_wait4, "wait4"),
        (libc::SYS_flock, "flock"),
        (libc::SYS_fsync, "fsync"),
    ];
    // `c_long` is 32 bits on some targets, the same type as i64 on others.
    #[allow(clippy::useless_conversion)]
    COMMON
        .iter()
        .chain(ARCH_ONLY)
        .find(|(n, _)| i64::from(*n) == number)
        .map(|(_, name)| *name)
}

#[cfg(not(target_os = "linux"))]
fn syscall_name(_number: i64) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_lines() {
        assert_eq!(describe_syscall("running\n").as_deref(), Some("running"));
        assert_eq!(
            describe_syscall("-1 0x7ffc 0x0\n").as_deref(),
            Some("none (blocked outside a system call)")
        );
        assert_eq!(describe_syscall("").as_deref(), None);
        if cfg!(target_os = "linux") {
            let futex = format!(
                "{} 0x7f0 0x80 0x2 0x0 0x0 0x0 0x7ffc 0x7f1\n",
                libc::SYS_futex
            );
            assert_eq!(describe_syscall(&futex).as_deref(), Some("futex"));
        }
        assert_eq!(describe_syscall("99999 0x0").as_deref(), Some("#99999"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sleeping_thread_reads_as_sleeping_in_a_system_call() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            tid_tx.send(crate::guard::kernel_tid()).unwrap();
            // Blocks in the kernel until the test ends.
            let _ = stop_rx.recv();
        });
        let tid = tid_rx.recv().unwrap().expect("a kernel tid on Linux");
        // Poll until the thread has gone to sleep.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let state = loop {
            let state = KernelState::read(tid).unwrap();
            if state.state.as_deref().is_some_and(|s| s.starts_with('S')) {
                break state;
            }
            assert!(std::time::Instant::now() < deadline, "never slept: {state}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        drop(stop_tx);
        sleeper.join().unwrap();
        assert!(
            state.to_string().starts_with("state S (sleeping)"),
            "{state}"
        );
        // The syscall file is behind the kernel's ptrace access check, which always
        // lets a process read its own threads' (no security profile can deny that):
        // it is missing only from kernels built without it, and read wherever it exists.
        if std::path::Path::new("/proc/thread-self/syscall").exists() {
            assert_eq!(state.syscall.as_deref(), Some("futex"), "{state}");
        }
        assert!(matches!(
            KernelState::read(u32::MAX),
            Err(super::super::Error::NoSuchThread { .. })
        ));
    }
}
