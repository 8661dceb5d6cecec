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

pub(super) use super::maps::Maps;

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
    /// A frame shown for a tail call: the jump of the function that jumped to the frame
    /// below, which left no frame of its own. Only that function is named there, never
    /// code inlined into it.
    pub(super) tail: bool,
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
    /// The first of `addresses` found through a frame record that is not known exactly
    /// (one of a few places a realigning prologue allows, the only one that holds a
    /// record of a call of its function): it and the frames above are shown only when
    /// the walk reaches the guard's poll frame where the guard recorded it.
    pub(super) unverified_from: Option<usize>,
    /// Whether the walk ended at a frame whose caller is found through its frame
    /// pointer, which it did not have.
    needs_frame_pointer: bool,
}

impl Unwound {
    /// These frames, ending with a note saying why the frames above could not be shown.
    fn cut(mut self, why: String) -> Self {
        self.stopped_early = Some(why);
        self.needs_frame_pointer = false;
        self
    }
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
    /// a frame pointer (a parked thread), the first frame that needs one has its frame
    /// record placed from its function's prologue, or the walk ends there with a note.
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

    use super::super::maps::{Mapping, VDSO};
    use super::super::vouch::{Call, Code, Functions, Starts, frame_record_place};
    use super::{Address, Failure, Maps, Registers, StackCopy, Unwound, past};

    /// The frame pointer a walk without one starts from: no stack is there, so a step
    /// that reads at it (or just beside it) is one that needed the frame pointer.
    const NO_FRAME_POINTER: u64 = (u64::MAX - 0xffff) & !0xf;

    /// Whether `at`, where a step could not read, was reached from [`NO_FRAME_POINTER`].
    fn near_no_frame_pointer(at: u64) -> bool {
        at >= NO_FRAME_POINTER - 0x1_0000
    }

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
                return self.walk(maps, registers, fp, stack, max_frames, deadline);
            }
            // The frame pointer is not in the `syscall` file, and code built with frame
            // pointers (the Rust standard library is) finds its caller's frame through
            // it: the walk without it ends at the first such frame. That frame's record
            // (its caller's frame pointer and its return address) is where its
            // prologue put it, a fixed distance above its stack pointer, which is just
            // above the slot of the return address into it: when the prologue is one
            // parsed whole, the record is known exactly, and no stale record can be
            // taken for it. Nothing is searched for: a record found by searching could
            // be one left by an earlier call that has returned.
            let without = self.walk(
                maps,
                registers,
                NO_FRAME_POINTER,
                stack,
                max_frames,
                deadline,
            )?;
            if !without.needs_frame_pointer {
                return Ok(without);
            }
            let index = without.addresses.len() - 1;
            let needs_fp = without.addresses[index];
            // Its stack pointer: the thread's for the innermost frame, else just above
            // the slot the return address into it was read from.
            let sp = if index == 0 {
                Some(registers.sp)
            } else {
                without.frame_starts[index].map(|slot| slot + 8)
            };
            let code = Code {
                maps,
                memory: &stack.memory,
            };
            let ip = needs_fp.ip;
            let Some((sp, start)) = sp.zip(self.starts.start_of(needs_fp.lookup as u64)) else {
                return Ok(without.cut(format!(
                    "frames above {ip:#x} could not be unwound: its caller is found through \
                     its frame pointer, and where its function starts is not known"
                )));
            };
            let Some(place) = frame_record_place(&code, start) else {
                return Ok(without.cut(format!(
                    "frames above {ip:#x} could not be unwound: its caller is found through \
                     its frame pointer, and its function's prologue (at {start:#x}) is not \
                     one the unwinder parses whole, so where its frame record is is not known"
                )));
            };
            let low = sp + place.offset;
            let records: Vec<u64> = if place.slack == 0 {
                vec![low]
            } else {
                // A realigned frame: its record is 16-byte aligned (the stack pointer at
                // the call, less the return address and the saved frame pointer) within
                // the alignment, and holds a return address after a call that could be
                // of its function. The only such place is taken, to be verified.
                (low.next_multiple_of(16)..=low + place.slack)
                    .step_by(16)
                    .filter(|&at| {
                        stack
                            .word(at + 8)
                            .is_ok_and(|ret| self.starts.could_call(&code, start, ret))
                    })
                    .collect()
            };
            let [record] = records[..] else {
                return Ok(without.cut(format!(
                    "frames above {ip:#x} could not be unwound: its function's prologue (at \
                     {start:#x}) realigns the stack, and {} places within the alignment \
                     could hold its frame record",
                    records.len()
                )));
            };
            let mut walk = self.walk(maps, registers, record, stack, max_frames, deadline)?;
            if walk.addresses.len() <= without.addresses.len()
                || walk.addresses[..without.addresses.len()] != without.addresses[..]
            {
                return Ok(without.cut(format!(
                    "frames above {ip:#x} could not be unwound: its frame record, where its \
                     prologue puts it ({record:#x}), does not lead to a caller that can be \
                     vouched for"
                )));
            }
            if place.slack != 0 {
                walk.unverified_from = Some(without.addresses.len());
            }
            Ok(walk)
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
        /// for before its frame is kept, until `deadline`.
        fn walk(
            &mut self,
            maps: &Maps,
            registers: &Registers,
            fp: u64,
            stack: &StackCopy,
            max_frames: usize,
            deadline: Instant,
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
                if Instant::now() >= deadline {
                    out.stopped_early = Some(format!(
                        "frames above {:#x} were not unwound: the capture's deadline passed",
                        out.addresses.last().map_or(registers.pc, |a| a.ip as u64)
                    ));
                    break;
                }
                reads.borrow_mut().clear();
                let frame = match frames.next() {
                    Ok(Some(frame)) => frame,
                    // The outermost frame, or one whose caller is marked as none (a walk
                    // from NO_FRAME_POINTER does not end here for want of one: the
                    // frame-pointer rule reads at it and fails).
                    Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => break,
                    // An error ends the walk where it is: the frames so far are still true.
                    Err(error) => {
                        if fp == NO_FRAME_POINTER && needed_the_frame_pointer(&error) {
                            out.needs_frame_pointer = true;
                        } else {
                            out.stopped_early = Some(describe(error, out.addresses.last()));
                        }
                        break;
                    }
                };
                let address = Address {
                    ip: usize::try_from(frame.address()).unwrap_or(usize::MAX),
                    lookup: usize::try_from(frame.address_for_lookup()).unwrap_or(usize::MAX),
                    tail: false,
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
                    match self
                        .starts
                        .vouch(&code, below.lookup as u64, address.ip as u64)
                    {
                        // A caller found by the unwind tables from registers the walk
                        // knows: the call is what it is, direct or not.
                        Ok(Call::Direct | Call::Indirect) => {}
                        // The tail-calling function is shown where its frame would be, at
                        // its jump: it was called, and its last act was that jump to the
                        // frame below.
                        Ok(Call::Tail(jump)) => {
                            let jump = usize::try_from(jump).unwrap_or(usize::MAX);
                            out.addresses.push(Address {
                                ip: jump,
                                lookup: jump,
                                tail: true,
                            });
                            out.frame_starts.push(None);
                            if out.addresses.len() >= max_frames {
                                break;
                            }
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

    /// Whether a walk started from [`NO_FRAME_POINTER`] stopped with `error` because a
    /// step needed the frame pointer.
    fn needed_the_frame_pointer(error: &framehop::Error) -> bool {
        match error {
            framehop::Error::CouldNotReadStack(at) => near_no_frame_pointer(*at),
            framehop::Error::IntegerOverflow => true,
            _ => false,
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
        if path == VDSO {
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
            [".plt", ".plt.sec", ".plt.got"]
                .into_iter()
                .filter_map(&range)
                .map(|r| r.start.wrapping_add(bias)..r.end.wrapping_add(bias))
                .collect(),
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
}
