//! Unwinds a thread parked in the kernel from the registers the kernel shows for it,
//! without sending it anything: the thread never notices.
//!
//! `/proc/self/task/<tid>/syscall` gives the stack pointer and instruction pointer of a
//! thread blocked in the kernel (or `running`). Its stack is then read through
//! `/proc/self/mem`, which fails cleanly on an unmapped address instead of faulting,
//! and unwound with the DWARF call frame information (`.eh_frame`) of the binary and
//! libraries mapped in the process, read from their files. The stack is copied between
//! two reads of the `syscall` file, and used only if the two agree: a thread that woke
//! up meanwhile has moved, and its copy is thrown away.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

/// How much of a stack one capture copies, from the stack pointer up: far more than
/// any stack a hang report shows.
const MAX_STACK_COPY: u64 = 1 << 20;

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

/// One frame found by the unwinder: where it is, and the address to look its symbol up
/// by (a return address less one, so that it falls inside the call instruction and
/// resolves to the calling line and inlined frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Address {
    pub(super) ip: usize,
    pub(super) lookup: usize,
}

/// Why a parked thread's stack could not be unwound.
#[derive(Debug)]
pub(super) enum Failure {
    /// The thread moved while its stack was read, every time it was tried.
    KeptMoving,
    /// The thread is running after all.
    Running,
    /// Reading `/proc` failed.
    Io(io::Error),
    /// Unwinding from the kernel's registers is not implemented for this architecture.
    Unsupported,
}

/// How many times a capture copies the stack of a thread that moves while it is read.
const ATTEMPTS: usize = 3;

/// Unwinds thread `tid`, parked at `parked`, from its own registers: the frames, the
/// innermost first, and at most `max_frames` of them.
pub(super) fn unwind(
    tid: u32,
    mut parked: Parked,
    max_frames: usize,
) -> Result<Vec<Address>, Failure> {
    for _ in 0..ATTEMPTS {
        let maps = Maps::read().map_err(Failure::Io)?;
        let stack = StackCopy::read(&maps, parked.sp).map_err(Failure::Io)?;
        let frames = unwind_copy(&maps, &parked, &stack, max_frames)?;
        match whereabouts(tid).map_err(Failure::Io)? {
            Whereabouts::Parked(after) if after == parked => return Ok(frames),
            Whereabouts::Parked(after) => parked = after,
            Whereabouts::Running => return Err(Failure::Running),
        }
    }
    Err(Failure::KeptMoving)
}

/// A copy of the top of a stack, and `/proc/self/mem` for any word beyond it.
struct StackCopy {
    start: u64,
    bytes: Vec<u8>,
    memory: File,
}

impl StackCopy {
    /// Copies from `sp` to the end of the mapping it is in, at most [`MAX_STACK_COPY`].
    fn read(maps: &Maps, sp: u64) -> io::Result<Self> {
        let memory = File::open("/proc/self/mem")?;
        let end = maps
            .containing(sp)
            .map_or(sp, |m| m.range.end.min(sp.saturating_add(MAX_STACK_COPY)));
        let mut bytes = vec![0; usize::try_from(end - sp).unwrap_or(0)];
        memory.read_exact_at(&mut bytes, sp)?;
        Ok(Self {
            start: sp,
            bytes,
            memory,
        })
    }

    /// The word at `address`, from the copy when it holds it.
    fn word(&self, address: u64) -> Result<u64, ()> {
        let mut word = [0; 8];
        match address
            .checked_sub(self.start)
            .and_then(|offset| usize::try_from(offset).ok())
            .and_then(|offset| self.bytes.get(offset..offset + 8))
        {
            Some(bytes) => word.copy_from_slice(bytes),
            None => self
                .memory
                .read_exact_at(&mut word, address)
                .map_err(|_| ())?,
        }
        Ok(u64::from_ne_bytes(word))
    }
}

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mapping {
    range: Range<u64>,
    executable: bool,
    offset: u64,
    path: Option<String>,
}

/// The mappings of this process, by start address.
struct Maps(Vec<Mapping>);

impl Maps {
    fn read() -> io::Result<Self> {
        let text = std::fs::read_to_string("/proc/self/maps")?;
        Ok(Self(text.lines().filter_map(parse_mapping).collect()))
    }

    fn containing(&self, address: u64) -> Option<&Mapping> {
        self.0.iter().find(|m| m.range.contains(&address))
    }

    /// The files mapped with code, each with its mappings: what the unwinder needs
    /// unwind tables from.
    fn code_files(&self) -> Vec<(String, Vec<&Mapping>)> {
        let mut files: Vec<(String, Vec<&Mapping>)> = Vec::new();
        for mapping in &self.0 {
            let Some(path) = mapping.path.as_deref().filter(|p| p.starts_with('/')) else {
                continue;
            };
            match files.iter_mut().find(|(p, _)| p == path) {
                Some((_, mappings)) => mappings.push(mapping),
                None => files.push((path.to_owned(), vec![mapping])),
            }
        }
        files.retain(|(_, mappings)| mappings.iter().any(|m| m.executable));
        files
    }
}

/// `start-end perms offset dev inode [path]`.
fn parse_mapping(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().map(str::trim).filter(|p| !p.is_empty());
    Some(Mapping {
        range: u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.map(str::to_owned),
    })
}

#[cfg(target_arch = "x86_64")]
mod native {
    use std::ops::Range;

    use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
    use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
    use object::{Object, ObjectSection, ObjectSegment};

    use super::{Address, Failure, Mapping, Maps, Parked, StackCopy};

    /// The unwinder over the files mapped when it was built, and what it was built
    /// from: rebuilt only when the process maps other code.
    pub(super) struct Tables {
        built_from: Vec<(String, u64)>,
        unwinder: UnwinderX86_64<Vec<u8>>,
        cache: CacheX86_64,
    }

    impl Tables {
        fn build(files: &[(String, Vec<&Mapping>)]) -> Self {
            let mut unwinder = UnwinderX86_64::new();
            for (path, mappings) in files {
                if let Some(module) = module(path, mappings) {
                    unwinder.add_module(module);
                }
            }
            Self {
                built_from: key(files),
                unwinder,
                cache: CacheX86_64::new(),
            }
        }
    }

    fn key(files: &[(String, Vec<&Mapping>)]) -> Vec<(String, u64)> {
        files
            .iter()
            .map(|(path, mappings)| (path.clone(), mappings[0].range.start))
            .collect()
    }

    /// The unwind tables of one mapped file: where its code is in this process, and its
    /// `.eh_frame`, read from the file. None when it has none or cannot be read.
    fn module(path: &str, mappings: &[&Mapping]) -> Option<Module<Vec<u8>>> {
        let file = std::fs::File::open(path).ok()?;
        let cache = object::read::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        // The load bias: where the first loadable segment is, less where it asks to be.
        let first_vaddr = elf.segments().map(|s| s.address()).min()? & !0xfff;
        let first_mapped = mappings.iter().find(|m| m.offset == 0)?.range.start;
        let bias = first_mapped.checked_sub(first_vaddr)?;
        let code = mappings.iter().filter(|m| m.executable);
        let avma = code.clone().map(|m| m.range.start).min()?..code.map(|m| m.range.end).max()?;
        let range = |name: &str| -> Option<Range<u64>> {
            let s = elf.section_by_name(name)?;
            Some(s.address()..s.address() + s.size())
        };
        let data = |name: &str| -> Option<Vec<u8>> {
            Some(elf.section_by_name(name)?.data().ok()?.to_vec())
        };
        let eh_frame = data(".eh_frame")?;
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(".text"),
            text: None,
            stubs_svma: None,
            stub_helper_svma: None,
            got_svma: range(".got"),
            unwind_info: None,
            eh_frame_svma: range(".eh_frame"),
            eh_frame: Some(eh_frame),
            eh_frame_hdr_svma: range(".eh_frame_hdr"),
            eh_frame_hdr: data(".eh_frame_hdr"),
            debug_frame: None,
            text_segment_svma: None,
            text_segment: None,
        };
        Some(Module::new(path.to_owned(), avma, bias, info))
    }

    /// Unwinds `stack` from the registers of `parked`, with the tables in `tables`
    /// (built, or rebuilt, for the files in `maps`).
    pub(super) fn unwind(
        tables: &mut Option<Tables>,
        maps: &Maps,
        parked: &Parked,
        stack: &StackCopy,
        max_frames: usize,
    ) -> Result<Vec<Address>, Failure> {
        let files = maps.code_files();
        if tables.as_ref().is_none_or(|t| t.built_from != key(&files)) {
            *tables = Some(Tables::build(&files));
        }
        let Some(tables) = tables.as_mut() else {
            return Err(Failure::Unsupported);
        };
        // The frame pointer is not in the `syscall` file, and code built with frame
        // pointers (the Rust standard library is) finds its caller's frame through it.
        // Every frame record on the stack (a saved frame pointer that points further up
        // the stack, beside a return address into code) is a candidate for it: the walk
        // from the first candidate that explains the stack furthest is taken, and the
        // walk without one when no candidate beats it.
        let mut best = walk(tables, parked, stack, 0, max_frames);
        for bp in frame_records(maps, stack).take(MAX_FRAME_POINTER_CANDIDATES) {
            let frames = walk(tables, parked, stack, bp, max_frames);
            if frames.len() > best.len() {
                best = frames;
            }
        }
        Ok(best)
    }

    /// How many frame records a capture tries as the frame pointer.
    const MAX_FRAME_POINTER_CANDIDATES: usize = 64;

    /// The addresses on `stack`, innermost first, that look like a frame record: a
    /// saved frame pointer of 0 or further up the stack, then a return address into code.
    fn frame_records<'a>(maps: &'a Maps, stack: &'a StackCopy) -> impl Iterator<Item = u64> + 'a {
        let end = stack.start + stack.bytes.len() as u64;
        (stack.start..end.saturating_sub(8))
            .step_by(8)
            .filter(move |&at| {
                let (Ok(saved), Ok(ret)) = (stack.word(at), stack.word(at + 8)) else {
                    return false;
                };
                (saved == 0 || (saved > at && saved < end))
                    && maps.containing(ret).is_some_and(|m| m.executable)
            })
    }

    /// One walk from the registers of `parked`, with `bp` as the frame pointer.
    fn walk(
        tables: &mut Tables,
        parked: &Parked,
        stack: &StackCopy,
        bp: u64,
        max_frames: usize,
    ) -> Vec<Address> {
        let regs = UnwindRegsX86_64::new(parked.pc, parked.sp, bp);
        let mut read = |address| stack.word(address);
        let mut frames = tables
            .unwinder
            .iter_frames(parked.pc, regs, &mut tables.cache, &mut read);
        let mut out = Vec::new();
        // An error ends the walk where it is: the frames found so far are still true.
        while let Ok(Some(frame)) = frames.next() {
            let ip = usize::try_from(frame.address()).unwrap_or(usize::MAX);
            let lookup = usize::try_from(frame.address_for_lookup()).unwrap_or(usize::MAX);
            out.push(Address { ip, lookup });
            if out.len() >= max_frames {
                break;
            }
        }
        out
    }
}

/// The unwind tables, kept between captures (reading them is the slow part).
#[cfg(target_arch = "x86_64")]
static TABLES: Mutex<Option<native::Tables>> = Mutex::new(None);

#[cfg(target_arch = "x86_64")]
fn unwind_copy(
    maps: &Maps,
    parked: &Parked,
    stack: &StackCopy,
    max_frames: usize,
) -> Result<Vec<Address>, Failure> {
    let mut tables = TABLES.lock().unwrap_or_else(|p| p.into_inner());
    native::unwind(&mut tables, maps, parked, stack, max_frames)
}

/// Elsewhere the kernel's `syscall` file lacks a register the unwind needs (the link
/// register on aarch64).
#[cfg(not(target_arch = "x86_64"))]
fn unwind_copy(
    _maps: &Maps,
    _parked: &Parked,
    _stack: &StackCopy,
    _max_frames: usize,
) -> Result<Vec<Address>, Failure> {
    Err(Failure::Unsupported)
}

/// How many distinct code files are mapped (for tests of the table cache).
#[cfg(test)]
fn code_file_count() -> usize {
    Maps::read().map(|m| m.code_files().len()).unwrap_or(0)
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

    #[test]
    fn maps_lines_parse() {
        let m = parse_mapping(
            "55d0a000-55d0b000 r-xp 00001000 08:01 1234                       /usr/bin/x",
        )
        .unwrap();
        assert_eq!(m.range, 0x55d0_a000..0x55d0_b000);
        assert!(m.executable);
        assert_eq!(m.offset, 0x1000);
        assert_eq!(m.path.as_deref(), Some("/usr/bin/x"));
        let anonymous = parse_mapping("7ffc0000-7ffd0000 rw-p 00000000 00:00 0").unwrap();
        assert!(!anonymous.executable);
        assert_eq!(anonymous.path, None);
        assert!(code_file_count() >= 1, "this test binary maps its own code");
    }
}
