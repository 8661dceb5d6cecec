//! The path of a thread blocked in the kernel: where it is, and its stack unwound from
//! the kernel's registers without stopping it.
//!
//! `/proc/self/task/<tid>/syscall` gives the stack pointer and instruction pointer of a
//! thread blocked in the kernel (or `running`). Its stack is copied between two reads of
//! that file and used only if the two agree: a thread that woke up meanwhile has moved,
//! and its copy is thrown away.

use std::io;
use std::time::Instant;

use super::unwind::{Failure, Maps, Registers, StackCopy, Unwinder, Unwound, past};

/// Where the kernel says a thread is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Whereabouts {
    /// In user space, running (or runnable): only a signal can stop it to look.
    Running,
    /// Blocked in the kernel, in a system call or not.
    Parked(Parked),
}

/// A thread blocked in the kernel: the whole `syscall` line (the call and its
/// arguments, to tell a later different call apart), and its user stack and
/// instruction pointers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Parked {
    line: String,
    sp: u64,
    pc: u64,
}

impl Parked {
    fn registers(&self) -> Registers {
        Registers {
            pc: self.pc,
            sp: self.sp,
            fp: None,
            lr: None,
        }
    }
}

/// Reads where thread `tid` of this process is.
pub(super) fn whereabouts(tid: u32) -> io::Result<Whereabouts> {
    let line = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))?;
    parse_whereabouts(&line)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("syscall {line:?}")))
}

/// `running`, or `<nr> [<6 args>] <sp> <pc>` in hex (`-1 <sp> <pc>` when blocked
/// outside a system call).
fn parse_whereabouts(line: &str) -> Option<Whereabouts> {
    let line = line.trim();
    if line == "running" {
        return Some(Whereabouts::Running);
    }
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 3 {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    Some(Whereabouts::Parked(Parked {
        line: line.to_owned(),
        sp: hex(fields[fields.len() - 2])?,
        pc: hex(fields[fields.len() - 1])?,
    }))
}

/// How many times a capture copies the stack of a thread that moves while it is read.
const ATTEMPTS: usize = 3;

/// Unwinds thread `tid`, parked at `parked`, from its own registers: the frames, the
/// innermost first, and at most `max_frames` of them.
pub(super) fn unwind_parked(
    unwinder: &mut Unwinder,
    tid: u32,
    mut parked: Parked,
    max_frames: usize,
    deadline: Instant,
) -> Result<Unwound, Failure> {
    for _ in 0..ATTEMPTS {
        let maps = Maps::read().map_err(Failure::Maps)?;
        unwinder.update(&maps, deadline)?;
        past(deadline, "copying the stack")?;
        let stack = StackCopy::read(&maps, parked.sp).map_err(Failure::Stack)?;
        let unwound = unwinder.unwind(&maps, &parked.registers(), &stack, max_frames, deadline)?;
        match whereabouts(tid).map_err(Failure::Whereabouts)? {
            Whereabouts::Parked(after) if after == parked => return Ok(unwound),
            Whereabouts::Parked(after) => parked = after,
            Whereabouts::Running => return Err(Failure::Running),
        }
    }
    Err(Failure::KeptMoving)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_lines_parse() {
        assert_eq!(parse_whereabouts("running\n"), Some(Whereabouts::Running));
        let line = "7 0x7f0 0x1 0x3e8 0x0 0x0 0x0 0x7ffc1000 0x7f12345\n";
        assert_eq!(
            parse_whereabouts(line),
            Some(Whereabouts::Parked(Parked {
                line: line.trim().to_owned(),
                sp: 0x7ffc_1000,
                pc: 0x7f1_2345,
            }))
        );
        assert!(matches!(
            parse_whereabouts("-1 0x7ffc 0x401000"),
            Some(Whereabouts::Parked(Parked {
                sp: 0x7ffc,
                pc: 0x40_1000,
                ..
            }))
        ));
        assert_eq!(parse_whereabouts(""), None);
        assert_eq!(parse_whereabouts("7 zz 0x1"), None);
    }
}
