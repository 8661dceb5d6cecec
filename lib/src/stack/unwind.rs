//! The unwinder both capture paths use: a thread's registers, a copy of its stack, the
//! process's memory map and the code's unwind tables, each step vouched for.
//!
//! The registers come from the kernel for a thread blocked in it (`parked.rs`) and from
//! the signal handler for a running one (`signal.rs`). Either way the stack is copied
//! through `/proc/self/mem` (which fails cleanly on an unmapped address instead of
//! faulting), bounded to the mapping the stack pointer is in, and unwound here with the
//! DWARF call frame information (`.eh_frame`) of the binary and libraries mapped in the
//! process, read from their files, each step checked by `vouch.rs`.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// How much of a stack one capture copies, from the stack pointer up: far more than
/// any stack a hang report shows.
const MAX_STACK_COPY: u64 = 1 << 20;

/// The registers an unwind starts from. The frame pointer is known only for a thread
/// stopped by the signal; the link register (aarch64) only there too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Registers {
    pub(super) pc: u64,
    pub(super) sp: u64,
    pub(super) fp: Option<u64>,
    pub(super) lr: Option<u64>,
}

/// One frame found by the unwinder: where it is, and the address to look its symbol up
/// by (a return address less one, so that it falls inside the call instruction and
/// resolves to the calling line and inlined frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Address {
    pub(super) ip: usize,
    pub(super) lookup: usize,
}

/// The frames of one unwind, innermost first, and why it stopped before the thread's
/// outermost frame when it did (the frames found are still right).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Unwound {
    pub(super) addresses: Vec<Address>,
    /// For each of `addresses`, where its frame starts on the stack, where known: the
    /// stack pointer for the innermost, the slot its return address was read from for
    /// the others (a frame shown for a tail call has none of its own).
    pub(super) frame_starts: Vec<Option<u64>>,
    pub(super) stopped_early: Option<String>,
}

/// Why a stack could not be unwound.
#[derive(Debug)]
pub(super) enum Failure {
    /// The thread moved while its stack was read, every time it was tried.
    KeptMoving,
    /// The thread is running after all.
    Running,
    /// Reading the thread's `syscall` file failed.
    Whereabouts(io::Error),
    /// Reading `/proc/self/maps` failed.
    Maps(io::Error),
    /// Copying the stack through `/proc/self/mem` failed.
    Stack(io::Error),
    /// The capture's deadline passed while doing this.
    Deadline(&'static str),
    /// Unwinding from these registers is not implemented for this architecture.
    Unsupported,
}

/// Fails with what was being done when `deadline` has passed.
pub(super) fn past(deadline: Instant, doing: &'static str) -> Result<(), Failure> {
    if Instant::now() >= deadline {
        return Err(Failure::Deadline(doing));
    }
    Ok(())
}

/// A copy of the top of a stack, and `/proc/self/mem` for any word beyond it that is
/// still in the stack's mapping (never a word elsewhere: another mapping could be a
/// file on a hung network filesystem).
pub(super) struct StackCopy {
    start: u64,
    bytes: Vec<u8>,
    mapping: Range<u64>,
    pub(super) memory: File,
    /// Whether words beyond the copy may be read from the thread's stack now: not for
    /// a running thread's copy, made while it was held and read after it was let go.
    live: bool,
}

/// What copying a running thread's stack needs, made before the thread is stopped:
/// `/proc/self/mem` open and a buffer of the largest copy, written once so that its
/// pages are mapped already (a fresh zeroed buffer's would be mapped by the copy, one
/// fault a page, during the hold), so that the hold is only the copy.
pub(super) struct PreparedCopy {
    memory: File,
    bytes: Vec<u8>,
}

impl PreparedCopy {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            memory: File::open("/proc/self/mem")?,
            bytes: vec![0xff; usize::try_from(MAX_STACK_COPY).unwrap_or(usize::MAX)],
        })
    }

    /// Copies from `sp` to the end of the mapping it is in, at most [`MAX_STACK_COPY`]:
    /// no file opened, nothing allocated (an error is a bare kind).
    pub(super) fn copy(mut self, maps: &Maps, sp: u64) -> io::Result<StackCopy> {
        let mapping = maps
            .containing(sp)
            .map(|m| m.range.clone())
            .ok_or(io::ErrorKind::NotFound)?;
        let end = mapping.end.min(sp.saturating_add(MAX_STACK_COPY));
        let length = usize::try_from(end - sp).unwrap_or(0).min(self.bytes.len());
        self.memory.read_exact_at(&mut self.bytes[..length], sp)?;
        self.bytes.truncate(length);
        Ok(StackCopy {
            start: sp,
            bytes: self.bytes,
            mapping,
            memory: self.memory,
            live: false,
        })
    }
}

impl StackCopy {
    /// Copies from `sp` to the end of the mapping it is in, at most [`MAX_STACK_COPY`].
    pub(super) fn read(maps: &Maps, sp: u64) -> io::Result<Self> {
        let memory = File::open("/proc/self/mem")?;
        let mapping = maps
            .containing(sp)
            .map(|m| m.range.clone())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("the stack pointer {sp:#x} is in no mapping"),
                )
            })?;
        let end = mapping.end.min(sp.saturating_add(MAX_STACK_COPY));
        let mut bytes = vec![0; usize::try_from(end - sp).unwrap_or(0)];
        memory.read_exact_at(&mut bytes, sp)?;
        Ok(Self {
            start: sp,
            bytes,
            mapping,
            memory,
            live: true,
        })
    }

    /// The word at `address`, from the copy when it holds it.
    fn word(&self, address: u64) -> Result<u64, ()> {
        let mut word = [0; 8];
        match address
            .checked_sub(self.start)
            .and_then(|offset| usize::try_from(offset).ok())
            .and_then(|offset| self.bytes.get(offset..offset.checked_add(8)?))
        {
            Some(bytes) => word.copy_from_slice(bytes),
            None if self.live
                && self.mapping.contains(&address)
                && self.mapping.contains(&address.saturating_add(7)) =>
            {
                self.memory
                    .read_exact_at(&mut word, address)
                    .map_err(|_| ())?;
            }
            None => return Err(()),
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
#[derive(Default)]
pub(super) struct Maps(Vec<Mapping>);

impl Maps {
    pub(super) fn read() -> io::Result<Self> {
        let text = std::fs::read_to_string("/proc/self/maps")?;
        Ok(Self(text.lines().filter_map(parse_mapping).collect()))
    }

    /// The file that `address` lies in, and where in the file, if that file is still
    /// there (not `[vdso]`, not deleted).
    pub(super) fn file_offset(&self, address: u64) -> Option<(&str, u64)> {
        let mapping = self.containing(address)?;
        let path = mapping
            .path
            .as_deref()
            .filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))?;
        Some((path, mapping.offset + (address - mapping.range.start)))
    }

    /// The mapping `address` is in: its range, whether it is executable, whether it
    /// maps a file.
    pub(super) fn mapping_of(&self, address: u64) -> Option<(Range<u64>, bool, bool)> {
        let m = self.containing(address)?;
        let is_file = m.path.as_deref().is_some_and(|p| p.starts_with('/'));
        Some((m.range.clone(), m.executable, is_file))
    }

    fn containing(&self, address: u64) -> Option<&Mapping> {
        self.0.iter().find(|m| m.range.contains(&address))
    }

    /// The files mapped with code, each with its mappings, and the vDSO (the kernel's
    /// code in every process, `clock_gettime` among it): what the unwinder needs unwind
    /// tables from.
    fn code_files(&self) -> Vec<(String, Vec<&Mapping>)> {
        let mut files: Vec<(String, Vec<&Mapping>)> = Vec::new();
        for mapping in &self.0 {
            let Some(path) = mapping
                .path
                .as_deref()
                .filter(|p| p.starts_with('/') || *p == VDSO)
            else {
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

/// The vDSO's name in `/proc/self/maps`.
const VDSO: &str = "[vdso]";

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

/// The unwinder of this architecture over the unwind tables of the mapped files, kept
/// between captures (reading them is the slow part).
pub(super) struct Unwinder {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    tables: Option<native::Tables>,
}

impl Unwinder {
    pub(super) const fn new() -> Self {
        Self {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            tables: None,
        }
    }

    /// Reads the unwind tables of the code files in `maps` that it lacks (all of them
    /// again when a file it has was unmapped or moved), one file at a time until
    /// `deadline`: a capture that runs out of time leaves those it read to the next.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(clippy::unused_self, unused_variables)
    )]
    pub(super) fn update(&mut self, maps: &Maps, deadline: Instant) -> Result<(), Failure> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        return self
            .tables
            .get_or_insert_with(native::Tables::new)
            .update(maps, deadline);
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        Err(Failure::Unsupported)
    }

    /// Unwinds `stack` from `registers` with the tables read by [`Self::update`]. Without
    /// a frame pointer (a parked thread), each frame record on the stack is tried as one
    /// and the walk that explains the stack furthest is kept.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(clippy::unused_self, unused_variables)
    )]
    pub(super) fn unwind(
        &mut self,
        maps: &Maps,
        registers: &Registers,
        stack: &StackCopy,
        max_frames: usize,
        deadline: Instant,
    ) -> Result<Unwound, Failure> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        return match self.tables.as_mut() {
            Some(tables) => tables.unwind(maps, registers, stack, max_frames, deadline),
            None => Err(Failure::Unsupported),
        };
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        Err(Failure::Unsupported)
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod native {
    use std::ops::Range;
    use std::sync::Arc;
    use std::time::Instant;

    #[cfg(target_arch = "aarch64")]
    use framehop::aarch64::{
        CacheAarch64 as Cache, PtrAuthMask, UnwindRegsAarch64 as Regs,
        UnwinderAarch64 as ArchUnwinder,
    };
    #[cfg(target_arch = "x86_64")]
    use framehop::x86_64::{
        CacheX86_64 as Cache, UnwindRegsX86_64 as Regs, UnwinderX86_64 as ArchUnwinder,
    };
    use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
    use object::{Object, ObjectSection, ObjectSegment};

    use super::super::vouch::{Call, Code, Functions, Starts, frame_record_offset};
    use super::{Address, Failure, Mapping, Maps, Registers, StackCopy, Unwound, past};

    /// How many frame records a capture tries as the frame pointer.
    const MAX_FRAME_POINTER_CANDIDATES: usize = 64;

    /// How far above the stack pointer a frame record is searched for: the record of the
    /// first frame that needs one is in that frame or just above its callees'.
    const MAX_RECORD_SEARCH: u64 = 256 * 1024;

    /// The unwinder over the files read so far, and which files (path and first
    /// address) those are, with tables or without.
    pub(super) struct Tables {
        read: Vec<(String, u64)>,
        unwinder: ArchUnwinder<Arc<[u8]>>,
        cache: Cache,
        starts: Starts,
    }

    impl Tables {
        pub(super) fn new() -> Self {
            Self {
                read: Vec::new(),
                unwinder: ArchUnwinder::new(),
                cache: Cache::new(),
                starts: Starts::default(),
            }
        }

        pub(super) fn update(&mut self, maps: &Maps, deadline: Instant) -> Result<(), Failure> {
            let files = maps.code_files();
            let wanted: Vec<(String, u64)> = files
                .iter()
                .map(|(path, mappings)| (path.clone(), mappings[0].range.start))
                .collect();
            if self.read.iter().any(|file| !wanted.contains(file)) {
                *self = Self::new();
            }
            for ((path, mappings), file) in files.iter().zip(wanted) {
                if self.read.contains(&file) {
                    continue;
                }
                past(deadline, "reading the unwind tables of the mapped files")?;
                if let Some((module, functions)) = module(path, mappings) {
                    self.unwinder.add_module(module);
                    self.starts.0.push(functions);
                }
                self.read.push(file);
            }
            Ok(())
        }

        pub(super) fn unwind(
            &mut self,
            maps: &Maps,
            registers: &Registers,
            stack: &StackCopy,
            max_frames: usize,
            deadline: Instant,
        ) -> Result<Unwound, Failure> {
            if let Some(fp) = registers.fp {
                return self.walk(maps, registers, fp, stack, max_frames, None);
            }
            // The frame pointer is not in the `syscall` file, and code built with frame
            // pointers (the Rust standard library is) finds its caller's frame through
            // it. Every frame record on the stack (a saved frame pointer that points
            // further up the stack, beside a return address into code) is a candidate
            // for it, but a record can be stale: left by calls that have returned, in
            // memory a later frame never wrote. The step that takes a candidate as the
            // frame pointer must be a direct call of the function below it, the one
            // kind of step that a stale record cannot pass by chance; each later step
            // is checked too. Of the candidates, the walk vouched for furthest is taken
            // (the innermost of equals), and the walk without one when none beats it.
            let mut best = self.walk(maps, registers, 0, stack, max_frames, None)?;
            let without = best.addresses.clone();
            let Some(needs_fp) = without.last().copied() else {
                return Ok(best);
            };
            let code = Code {
                maps,
                memory: &stack.memory,
            };
            // Where the frame that needs it keeps its record, when its prologue says: its
            // stack pointer is just above the slot of the return address into it, and
            // the record a fixed distance above that. No stale record can be there.
            if let Some(record) = self.exact_record(&code, stack, &without) {
                let walk = self.walk(maps, registers, record, stack, max_frames, None)?;
                if walk.addresses.len() > without.len() {
                    return Ok(walk);
                }
            }
            // The record of the frame that needs the frame pointer holds a return address
            // after a call of that frame's function: only such records are walked from.
            // (Its saved frame pointer is not checked: a caller built without frame
            // pointers saves whatever the register held.)
            let records: Vec<u64> = frame_records(maps, stack)
                .take_while(|&at| at - stack.start < MAX_RECORD_SEARCH && Instant::now() < deadline)
                .filter(|&at| {
                    stack.word(at + 8).is_ok_and(|ret| {
                        matches!(
                            self.starts.vouch(&code, needs_fp.lookup as u64, ret),
                            Ok(Call::Direct | Call::Tail(_))
                        )
                    })
                })
                .take(MAX_FRAME_POINTER_CANDIDATES)
                .collect();
            for fp in records {
                if Instant::now() >= deadline {
                    if best.stopped_early.is_some() {
                        best.stopped_early = Some(
                            "frames above could not be unwound: the capture deadline passed \
                             while searching for the frame pointer"
                                .to_owned(),
                        );
                    }
                    break;
                }
                let walk = self.walk(maps, registers, fp, stack, max_frames, Some(&without))?;
                if walk.addresses.len() > best.addresses.len() {
                    best = walk;
                }
            }
            // The walk without a frame pointer ends where one was needed, even when the
            // unwinder takes its absence for the outermost frame: it says so (the capture
            // drops the note when that frame is where threads start).
            if best.addresses.len() == without.len() && best.stopped_early.is_none() {
                best.stopped_early = Some(format!(
                    "frames above {:#x} could not be unwound: no frame record on the stack \
                     could be vouched for as its caller's",
                    needs_fp.ip
                ));
            }
            Ok(best)
        }

        /// The address of the frame record of the outermost of `frames` (found without
        /// a frame pointer), from its function's prologue and the return address into
        /// it on the stack.
        fn exact_record(
            &self,
            code: &Code<'_>,
            stack: &StackCopy,
            frames: &[Address],
        ) -> Option<u64> {
            let [.., _, needs_fp] = frames else {
                return None;
            };
            let start = self.starts.start_of(needs_fp.lookup as u64)?;
            let offset = frame_record_offset(code, start)?;
            let end = stack.start + stack.bytes.len() as u64;
            let slot = (stack.start..end.saturating_sub(8))
                .step_by(8)
                .find(|&at| stack.word(at) == Ok(needs_fp.ip as u64))?;
            Some(slot + 8 + offset)
        }

        #[cfg(target_arch = "x86_64")]
        fn regs(&self, registers: &Registers, fp: u64) -> Result<Regs, Failure> {
            Ok(Regs::new(registers.pc, registers.sp, fp))
        }

        /// On aarch64 the innermost frame's return address is in the link register,
        /// which only the signal's context gives.
        #[cfg(target_arch = "aarch64")]
        fn regs(&self, registers: &Registers, fp: u64) -> Result<Regs, Failure> {
            let lr = registers.lr.ok_or(Failure::Unsupported)?;
            // Return addresses signed by pointer authentication carry bits above any
            // code address: framehop strips them with this mask.
            let mask = PtrAuthMask::from_max_known_address(self.unwinder.max_known_code_address());
            Ok(Regs::new_with_ptr_auth_mask(mask, lr, registers.sp, fp))
        }

        /// One walk from `registers`, with `fp` as the frame pointer, each step vouched
        /// for before its frame is kept. With `guessed_past`, `fp` is a guess: the first
        /// step where this walk leaves those frames (the walk without a frame pointer)
        /// is the one that took the guess, and must be a direct call.
        fn walk(
            &mut self,
            maps: &Maps,
            registers: &Registers,
            fp: u64,
            stack: &StackCopy,
            max_frames: usize,
            guessed_past: Option<&[Address]>,
        ) -> Result<Unwound, Failure> {
            let regs = self.regs(registers, fp)?;
            // The words each step reads, to tell which slot its return address was in.
            let reads = std::cell::RefCell::new(Vec::<(u64, u64)>::new());
            let mut read = |address| {
                let word = stack.word(address);
                if let Ok(word) = word {
                    reads.borrow_mut().push((address, word));
                }
                word
            };
            let mut frames =
                self.unwinder
                    .iter_frames(registers.pc, regs, &mut self.cache, &mut read);
            let code = Code {
                maps,
                memory: &stack.memory,
            };
            let mut out = Unwound::default();
            while out.addresses.len() < max_frames {
                reads.borrow_mut().clear();
                let frame = match frames.next() {
                    Ok(Some(frame)) => frame,
                    // The outermost frame, or one whose caller is marked as none.
                    Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => break,
                    // An error ends the walk where it is: the frames so far are still true.
                    Err(error) => {
                        out.stopped_early = Some(describe(error, out.addresses.last()));
                        break;
                    }
                };
                let address = Address {
                    ip: usize::try_from(frame.address()).unwrap_or(usize::MAX),
                    lookup: usize::try_from(frame.address_for_lookup()).unwrap_or(usize::MAX),
                };
                let frame_start = if out.addresses.is_empty() {
                    Some(registers.sp)
                } else {
                    reads
                        .borrow()
                        .iter()
                        .rev()
                        .find(|(_, word)| *word == frame.address())
                        .map(|(at, _)| *at)
                };
                if let Some(below) = out.addresses.last() {
                    let index = out.addresses.len();
                    let takes_the_guess = guessed_past.is_some_and(|without| {
                        without[..index.min(without.len())] == out.addresses[..]
                            && without.get(index) != Some(&address)
                    });
                    match self
                        .starts
                        .vouch(&code, below.lookup as u64, address.ip as u64)
                    {
                        Ok(Call::Direct) => {}
                        // The tail-calling function is shown where its frame would be: it
                        // was called, and its last act was to jump to the frame below.
                        Ok(Call::Tail(start)) => {
                            let start = usize::try_from(start).unwrap_or(usize::MAX);
                            out.addresses.push(Address {
                                ip: start,
                                lookup: start,
                            });
                            out.frame_starts.push(None);
                            if out.addresses.len() >= max_frames {
                                break;
                            }
                        }
                        Ok(Call::Indirect) if !takes_the_guess => {}
                        Ok(Call::Indirect) => {
                            out.stopped_early = Some(format!(
                                "frames above {:#x} could not be unwound: its caller was found \
                                 from a frame record on the stack, and the call before {:#x} \
                                 is indirect, so the record cannot be told from a stale one",
                                below.ip, address.ip
                            ));
                            break;
                        }
                        Err(why) => {
                            out.stopped_early = Some(format!(
                                "frames above {:#x} could not be unwound: {why}",
                                below.ip
                            ));
                            break;
                        }
                    }
                }
                out.addresses.push(address);
                out.frame_starts.push(frame_start);
            }
            Ok(out)
        }
    }

    /// Why a walk stopped, after the frame `last`.
    fn describe(error: framehop::Error, last: Option<&Address>) -> String {
        let why = match error {
            framehop::Error::CouldNotReadStack(at) => {
                format!("its caller's frame would be at {at:#x}, outside the thread's stack")
            }
            framehop::Error::FramepointerUnwindingMovedBackwards => {
                "the frame pointer chain went back down the stack".to_owned()
            }
            framehop::Error::DidNotAdvance => "its caller's frame was the same frame".to_owned(),
            framehop::Error::IntegerOverflow => "its caller's frame address overflowed".to_owned(),
            framehop::Error::ReturnAddressIsNull => "its return address is null".to_owned(),
        };
        match last {
            Some(last) => format!("the unwind stopped after {:#x}: {why}", last.ip),
            None => format!("the unwind stopped at once: {why}"),
        }
    }

    /// The unwind tables of one mapped file: where its code is in this process, and its
    /// `.eh_frame`, read from the file (the vDSO's from memory). None when it has none
    /// or cannot be read.
    fn module(path: &str, mappings: &[&Mapping]) -> Option<(Module<Arc<[u8]>>, Functions)> {
        if path == super::VDSO {
            // Not a file: its ELF image is the mapping itself, read like a stack.
            let mapping = mappings.iter().find(|m| m.executable)?;
            let length = usize::try_from(mapping.range.end - mapping.range.start).ok()?;
            if length > MAX_VDSO {
                return None;
            }
            let mut image = vec![0; length];
            let memory = std::fs::File::open("/proc/self/mem").ok()?;
            std::os::unix::fs::FileExt::read_exact_at(&memory, &mut image, mapping.range.start)
                .ok()?;
            let elf = object::File::parse(&*image).ok()?;
            return tables(&elf, path, mappings);
        }
        let file = std::fs::File::open(path).ok()?;
        let cache = object::read::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        tables(&elf, path, mappings)
    }

    /// The largest vDSO read (they are a few pages).
    const MAX_VDSO: usize = 1 << 20;

    /// The unwind tables of `elf`, mapped as `mappings`.
    fn tables<'data, R: object::ReadRef<'data>>(
        elf: &object::File<'data, R>,
        path: &str,
        mappings: &[&Mapping],
    ) -> Option<(Module<Arc<[u8]>>, Functions)> {
        // The load bias: where an executable mapping is, less where the segment that
        // holds its file offset asks to be. (Not from the mapping at offset 0: the file
        // can be mapped again, read-only, by the symbolizer.)
        let code = mappings.iter().filter(|m| m.executable);
        let first_code = code.clone().next()?;
        // The executable segment whose pages the mapping holds (the mapping starts at
        // a page boundary, which the segment before can share).
        let bias = elf.segments().find_map(|segment| {
            let object::SegmentFlags::Elf { p_flags, .. } = segment.flags() else {
                return None;
            };
            let (offset, size) = segment.file_range();
            let in_pages = (offset & !0xfff..offset + size).contains(&first_code.offset);
            if p_flags.0 & object::elf::PF_X.0 == 0 || !in_pages {
                return None;
            }
            // The address the mapping's first byte was linked at.
            let linked = segment.address().checked_sub(offset - first_code.offset)?;
            first_code.range.start.checked_sub(linked)
        })?;
        let avma = code.clone().map(|m| m.range.start).min()?..code.map(|m| m.range.end).max()?;
        let range = |name: &str| -> Option<Range<u64>> {
            let s = elf.section_by_name(name)?;
            Some(s.address()..s.address() + s.size())
        };
        let data = |name: &str| -> Option<Arc<[u8]>> {
            Some(Arc::from(elf.section_by_name(name)?.data().ok()?))
        };
        let eh_frame = data(".eh_frame")?;
        let eh_frame_hdr = data(".eh_frame_hdr");
        // Where functions start, for vouching for calls: without a sorted table none
        // can be, and a walk through the module stops at its first frame there.
        let functions = Functions::new(
            avma.clone(),
            bias,
            range(".eh_frame_hdr").map_or(0, |r| r.start),
            eh_frame_hdr.clone().unwrap_or_else(|| Arc::from(&[][..])),
            range(".eh_frame").map_or(0, |r| r.start),
            eh_frame.clone(),
        );
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
            eh_frame_hdr,
            debug_frame: None,
            text_segment_svma: None,
            text_segment: None,
        };
        Some((Module::new(path.to_owned(), avma, bias, info), functions))
    }

    /// The addresses on `stack`, innermost first, that could hold a frame record: a word,
    /// then a return address into code.
    fn frame_records<'a>(maps: &'a Maps, stack: &'a StackCopy) -> impl Iterator<Item = u64> + 'a {
        let end = stack.start + stack.bytes.len() as u64;
        (stack.start..end.saturating_sub(8))
            .step_by(8)
            .filter(move |&at| {
                stack
                    .word(at + 8)
                    .is_ok_and(|ret| maps.containing(ret).is_some_and(|m| m.executable))
            })
    }
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
    fn a_file_offset_names_a_mapped_file_that_is_still_there() {
        let maps = Maps(
            [
                "7f12a000-7f12c000 r-xp 00028000 08:01 1234   /usr/lib/libc.so.6",
                "7f0-7f1 r-xp 00000000 00:00 0   [vdso]",
                "8f0-8f1 r-xp 00000000 00:00 0",
                "9f0-9f1 r-xp 00000000 08:01 9 /opt/op (deleted)",
            ]
            .into_iter()
            .filter_map(parse_mapping)
            .collect(),
        );
        assert_eq!(
            maps.file_offset(0x7f12a010),
            Some(("/usr/lib/libc.so.6", 0x28010))
        );
        assert_eq!(maps.file_offset(0x7f0), None, "[vdso]");
        assert_eq!(maps.file_offset(0x8f0), None, "no file");
        assert_eq!(maps.file_offset(0x9f0), None, "deleted");
        assert_eq!(maps.file_offset(0x1), None, "not mapped");
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
