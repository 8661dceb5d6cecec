//! Vouches for each step of an unwind before it is shown: the return address must follow
//! a call instruction, and a direct call must call the function of the frame below.
//!
//! These checks catch a walk that went astray (a wrong frame record, code without unwind
//! information) at the first step that does not fit; they cannot tell a stale frame
//! record (left by a call that has returned) from a live one, which is why the unwinder
//! never searches the stack for records. A return address is the address after a call,
//! and when the call is direct its target is where the callee starts. The callee's start is
//! taken from its unwind table entry (`.eh_frame_hdr`'s sorted table and the FDE's
//! range), which every module the unwinder can step through has, stripped or not; a
//! symbol table would be missing from a stripped binary. Code is read through
//! `/proc/self/mem` and only inside executable mappings of loaded objects (GOT slots
//! inside their other mappings), so odd addresses fail cleanly and no page of a data
//! file is ever touched.
//!
//! It also places a frame record from its function's prologue (see [`RecordPlace`]),
//! when the prologue is one it parses completely: any instruction it does not know
//! there means "unknown", never a distance.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::maps::Maps;

/// How a step was vouched for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Call {
    /// A direct call (through a PLT stub or a GOT slot, if so) of the frame below's
    /// function.
    Direct,
    /// A direct call of a function whose code jumps to the frame below's function, at
    /// this address (its jump instruction): a tail call, which left no frame of its own.
    Tail(u64),
    /// An indirect call: its target cannot be checked.
    Indirect,
}

/// Where functions start and end in one mapped module, from its unwind tables.
pub(super) struct Functions {
    /// Where the module's code is mapped.
    code: std::ops::Range<u64>,
    /// The module's load bias (mapped address less the address it was linked at).
    bias: u64,
    hdr_svma: u64,
    hdr: Arc<[u8]>,
    eh_frame_svma: u64,
    eh_frame: Arc<[u8]>,
    /// Where its PLT stubs are (`.plt`, `.plt.sec`, `.plt.got`), as mapped: the only
    /// code a call is followed through to the function a GOT slot holds.
    stubs: Vec<std::ops::Range<u64>>,
}

impl Functions {
    pub(super) fn new(
        code: std::ops::Range<u64>,
        bias: u64,
        hdr_svma: u64,
        hdr: Arc<[u8]>,
        eh_frame_svma: u64,
        eh_frame: Arc<[u8]>,
        stubs: Vec<std::ops::Range<u64>>,
    ) -> Self {
        Self {
            code,
            bias,
            hdr_svma,
            hdr,
            eh_frame_svma,
            eh_frame,
            stubs,
        }
    }

    /// The start and length of the function whose unwind entry covers `address` (as
    /// mapped).
    fn range_of(&self, address: u64) -> Option<(u64, u64)> {
        if !self.code.contains(&address) {
            return None;
        }
        let svma = address.checked_sub(self.bias)?;
        let hdr = &*self.hdr;
        let (&[version, frame_ptr_enc, count_enc, table_enc], rest) = hdr.split_first_chunk()?;
        // The sorted table is in the form every linker writes: a count of 4 bytes, then
        // pairs of 4-byte offsets from the header's start.
        if version != 1 || count_enc != 0x03 || table_enc != 0x3b {
            return None;
        }
        let rest = rest.get(pointer_size(frame_ptr_enc)?..)?;
        let count = usize::try_from(u32::from_le_bytes(*rest.first_chunk()?)).ok()?;
        let table = rest.get(4..4 + count.checked_mul(8)?)?;
        let entry = |i: usize| -> Option<(u64, u64)> {
            let at = table.get(i * 8..i * 8 + 8)?;
            let start = i32::from_le_bytes(at[..4].try_into().ok()?);
            let fde = i32::from_le_bytes(at[4..].try_into().ok()?);
            Some((
                self.hdr_svma.wrapping_add_signed(i64::from(start)),
                self.hdr_svma.wrapping_add_signed(i64::from(fde)),
            ))
        };
        // The last entry that starts at or before the address.
        let (mut low, mut high) = (0, count);
        while low < high {
            let mid = low + (high - low) / 2;
            if entry(mid)?.0 <= svma {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let (start, fde) = entry(low.checked_sub(1)?)?;
        let (begin, length) = self.fde_range(fde)?;
        (begin == start && svma >= begin && svma - begin < length)
            .then(|| (begin.wrapping_add(self.bias), length))
    }

    /// The address range (start, length) of the FDE at `fde` (a linked address).
    fn fde_range(&self, fde: u64) -> Option<(u64, u64)> {
        let data = &*self.eh_frame;
        let at = usize::try_from(fde.checked_sub(self.eh_frame_svma)?).ok()?;
        let length = u32::from_le_bytes(*data.get(at..)?.first_chunk()?);
        if length == 0xffff_ffff {
            return None;
        }
        let cie_pointer = u32::from_le_bytes(*data.get(at + 4..)?.first_chunk()?);
        let cie = (at + 4).checked_sub(usize::try_from(cie_pointer).ok()?)?;
        let encoding = fde_encoding(data.get(cie..)?)?;
        let field = at + 8;
        let (begin, size) = read_encoded(data.get(field..)?, encoding)?;
        let begin = match encoding & 0x70 {
            0x00 => begin,
            // pc-relative: to where the field itself is linked.
            0x10 => begin.wrapping_add(self.eh_frame_svma + field as u64),
            _ => return None,
        };
        let (length, _) = read_encoded(data.get(field + size..)?, encoding & 0x0f)?;
        Some((begin, length))
    }
}

/// The size of a pointer of DWARF encoding `encoding`, when fixed.
fn pointer_size(encoding: u8) -> Option<usize> {
    match encoding & 0x0f {
        0x00 | 0x04 | 0x0c => Some(8),
        0x03 | 0x0b => Some(4),
        0x02 | 0x0a => Some(2),
        _ => None,
    }
}

/// A value of DWARF pointer encoding `encoding` (its format; the caller applies the
/// base) and its size.
fn read_encoded(data: &[u8], encoding: u8) -> Option<(u64, usize)> {
    let size = pointer_size(encoding)?;
    let bytes = data.get(..size)?;
    let value = match encoding & 0x0f {
        0x00 | 0x04 | 0x0c => u64::from_le_bytes(bytes.try_into().ok()?),
        0x03 => u64::from(u32::from_le_bytes(bytes.try_into().ok()?)),
        0x0b => i64::from(i32::from_le_bytes(bytes.try_into().ok()?)) as u64,
        0x02 => u64::from(u16::from_le_bytes(bytes.try_into().ok()?)),
        0x0a => i64::from(i16::from_le_bytes(bytes.try_into().ok()?)) as u64,
        _ => return None,
    };
    Some((value, size))
}

/// The pointer encoding of the FDEs of the CIE at the start of `cie`: its augmentation's
/// `R`, absolute 8-byte pointers without one.
fn fde_encoding(cie: &[u8]) -> Option<u8> {
    let mut at = 8; // length, CIE id
    let version = *cie.get(at)?;
    at += 1;
    let augmentation_len = cie.get(at..)?.iter().position(|&b| b == 0)?;
    let augmentation = cie.get(at..at + augmentation_len)?;
    at += augmentation_len + 1;
    if augmentation.first() != Some(&b'z') {
        return Some(0x00);
    }
    at = skip_leb128(cie, at)?; // code alignment
    at = skip_leb128(cie, at)?; // data alignment
    at = if version == 1 {
        at + 1
    } else {
        skip_leb128(cie, at)?
    }; // return address register
    at = skip_leb128(cie, at)?; // augmentation data length
    for &letter in &augmentation[1..] {
        match letter {
            b'R' => return cie.get(at).copied(),
            b'L' => at += 1,
            b'P' => {
                let encoding = *cie.get(at)?;
                at += 1 + pointer_size(encoding)?;
            }
            b'S' | b'B' => {}
            _ => return None,
        }
    }
    Some(0x00)
}

fn skip_leb128(data: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let byte = *data.get(at)?;
        at += 1;
        if byte & 0x80 == 0 {
            return Some(at);
        }
    }
}

/// Reads code and GOT slots of this process through `/proc/self/mem`.
pub(super) struct Code<'a> {
    pub(super) maps: &'a Maps,
    pub(super) memory: &'a File,
}

impl Code<'_> {
    /// The bytes at `address`, when they all lie in one mapping of a loaded object that
    /// is executable (or, with `executable` false, any of its mappings: a GOT slot).
    fn read<const N: usize>(&self, address: u64, executable: bool) -> Option<[u8; N]> {
        let last = address.checked_add(N as u64 - 1)?;
        let (range, is_executable) = self.maps.of_loaded_object(address)?;
        let fits = range.contains(&last) && (is_executable || !executable);
        if !fits {
            return None;
        }
        let mut bytes = [0; N];
        self.memory.read_exact_at(&mut bytes, address).ok()?;
        Some(bytes)
    }
}

#[cfg(target_arch = "x86_64")]
impl Code<'_> {
    /// `length` bytes at `address`, all in one executable mapping.
    fn read_vec(&self, address: u64, length: u64) -> Option<Vec<u8>> {
        let (range, executable) = self.maps.of_loaded_object(address)?;
        if !executable || !range.contains(&address.checked_add(length.checked_sub(1)?)?) {
            return None;
        }
        let mut bytes = vec![0; usize::try_from(length).ok()?];
        self.memory.read_exact_at(&mut bytes, address).ok()?;
        Some(bytes)
    }
}

/// The function tables of the modules read so far.
#[derive(Default)]
pub(super) struct Starts(pub(super) Vec<Functions>);

impl Starts {
    /// The start and length of the function `address` is in, from its module's
    /// unwind tables.
    fn range_of(&self, address: u64) -> Option<(u64, u64)> {
        self.0.iter().find_map(|f| f.range_of(address))
    }

    /// The start of the function `address` is in.
    pub(super) fn start_of(&self, address: u64) -> Option<u64> {
        self.range_of(address).map(|(start, _)| start)
    }

    /// Whether `address` is in a module's PLT stubs.
    fn is_stub(&self, address: u64) -> bool {
        self.0
            .iter()
            .any(|f| f.stubs.iter().any(|stubs| stubs.contains(&address)))
    }

    /// Where the PLT stub at `target` jumps, when `target` is one.
    fn through_stub(&self, code: &Code<'_>, target: u64) -> Option<u64> {
        self.is_stub(target)
            .then(|| through_stub(code, target))
            .flatten()
    }

    /// Whether the call before `return_address` could have called the function that
    /// starts at `start`: a direct call of it (through a PLT stub, if so), a call of a
    /// function that jumps to it, or an indirect call, whose target cannot be told.
    pub(super) fn could_call(&self, code: &Code<'_>, start: u64, return_address: u64) -> bool {
        match call_before(code, return_address) {
            None => false,
            Some(Target::Unknown) => true,
            Some(Target::At(target)) => {
                // Bytes of a direct call can also end an indirect one.
                target == start
                    || self.through_stub(code, target) == Some(start)
                    || indirect_call_ends_at_return(code, return_address)
                    || self.jumps_to(code, target, start).is_some()
            }
        }
    }

    /// Vouches that `return_address` follows a call of the function that
    /// `callee_address` (an address inside the frame below) is in: how, or why not.
    pub(super) fn vouch(
        &self,
        code: &Code<'_>,
        callee_address: u64,
        return_address: u64,
    ) -> Result<Call, String> {
        let (start, _) = self.range_of(callee_address).ok_or_else(|| {
            format!(
                "no unwind table entry covers {callee_address:#x}, so its caller cannot be checked"
            )
        })?;
        let found = call_before(code, return_address).ok_or_else(|| {
            format!("the return address {return_address:#x} does not follow a call instruction")
        })?;
        match found {
            Target::Unknown => Ok(Call::Indirect),
            Target::At(target) if target == start => Ok(Call::Direct),
            Target::At(target) => match self.through_stub(code, target) {
                Some(resolved) if resolved == start => Ok(Call::Direct),
                _ => match self.jumps_to(code, target, start) {
                    Some(jump) => Ok(Call::Tail(jump)),
                    None => Err(format!(
                        "the call before {return_address:#x} is to {target:#x}, not to the function at {start:#x}"
                    )),
                },
            },
        }
    }
}

/// How much of a function's code is searched for a tail call.
#[cfg(target_arch = "x86_64")]
const MAX_TAIL_CALL_SEARCH: u64 = 16 * 1024;

/// How much of a function without an unwind entry is searched for a tail call.
#[cfg(target_arch = "x86_64")]
const SHORT_TAIL_CALL_SEARCH: u64 = 32;

impl Starts {
    /// Whether the function that starts at `caller` jumps to `callee` (directly, or
    /// through a GOT slot or a PLT stub): a tail call. The jump's 4-byte displacement
    /// must land exactly on `callee` (or on a PLT stub whose slot holds it), which bytes
    /// that are not a jump match only by chance. A jump to another function that jumps
    /// on is not one: the function between would be missing.
    #[cfg(target_arch = "x86_64")]
    fn jumps_to(&self, code: &Code<'_>, caller: u64, callee: u64) -> Option<u64> {
        // A function that only sets arguments and jumps may have no unwind entry of its
        // own (it never moves the stack pointer): its first bytes are searched then.
        let (start, length) = self
            .range_of(caller)
            .filter(|&(start, _)| start == caller)
            .unwrap_or((caller, SHORT_TAIL_CALL_SEARCH));
        let length = length.min(MAX_TAIL_CALL_SEARCH);
        let body = code.read_vec(start, length)?;
        let rel = |b: [u8; 4]| i64::from(i32::from_le_bytes(b));
        let jumps = |at: usize| {
            let next = |size: usize| start + (at + size) as u64;
            match body[at..] {
                [0xe9, a, b, c, d, ..] => {
                    let target = next(5).wrapping_add_signed(rel([a, b, c, d]));
                    target == callee || self.through_stub(code, target) == Some(callee)
                }
                [0xff, 0x25, a, b, c, d, ..] => {
                    let slot = next(6).wrapping_add_signed(rel([a, b, c, d]));
                    code.read::<8>(slot, false).map(u64::from_le_bytes) == Some(callee)
                }
                _ => false,
            }
        };
        (0..body.len())
            .find(|&at| jumps(at))
            .map(|at| start + at as u64)
    }

    /// Tail calls are not searched for on aarch64: a walk stops at one.
    #[cfg(target_arch = "aarch64")]
    #[allow(clippy::unused_self)]
    fn jumps_to(&self, _code: &Code<'_>, _caller: u64, _callee: u64) -> Option<u64> {
        None
    }
}

/// Where a frame record of a function is, from the stack pointer of its frame once its
/// prologue has run: between `sp + offset` and `sp + offset + slack` (slack is 0 unless
/// the prologue realigns the stack pointer, which moves it down by up to the alignment
/// less one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RecordPlace {
    pub(super) offset: u64,
    pub(super) slack: u64,
}

/// How much of a prologue is read.
#[cfg(target_arch = "x86_64")]
const PROLOGUE_BYTES: usize = 64;

/// Where the frame record of a frame of the function at `start` is, when its prologue is
/// one of code with frame pointers that [`parse_prologue`] knows whole.
#[cfg(target_arch = "x86_64")]
pub(super) fn frame_record_place(code: &Code<'_>, start: u64) -> Option<RecordPlace> {
    // A function shorter than the bytes read ends its mapping rarely; the shorter read
    // is tried then.
    let bytes: [u8; PROLOGUE_BYTES] = code.read(start, true).or_else(|| {
        let short: [u8; 32] = code.read(start, true)?;
        let mut bytes = [0xcc; PROLOGUE_BYTES];
        bytes[..32].copy_from_slice(&short);
        Some(bytes)
    })?;
    parse_prologue(&bytes)
}

/// The place of the frame record of a function whose code starts with `bytes`: an
/// `endbr64`, `push %rbp; mov %rsp,%rbp`, pushes of saved registers, then any of: `sub`
/// of a constant from `%rsp` (LLVM's inline stack probes between: `movq $0,(%rsp)` or
/// `orq $0,(%rsp)` after each page), one `and $-N,%rsp` (realignment). The instruction
/// after must not be one that moves `%rsp` or starts a probe loop or a call of a probe
/// function: anything the parser does not know there is "unknown" (None), never a
/// distance that could be wrong.
#[cfg(target_arch = "x86_64")]
fn parse_prologue(bytes: &[u8]) -> Option<RecordPlace> {
    let mut at = if bytes.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        4
    } else {
        0
    };
    // push %rbp; mov %rsp,%rbp (either encoding)
    if !matches!(
        bytes.get(at..at + 4)?,
        [0x55, 0x48, 0x89, 0xe5] | [0x55, 0x48, 0x8b, 0xec]
    ) {
        return None;
    }
    at += 4;
    let mut offset: u64 = 0;
    let mut slack: u64 = 0;
    // Pushes of saved registers (not %rsp, not %rbp again).
    loop {
        match bytes.get(at..)? {
            [0x41, 0x50..=0x57, ..] => at += 2,
            [0x50..=0x53 | 0x56 | 0x57, ..] => at += 1,
            _ => break,
        }
        offset += 8;
    }
    loop {
        match bytes.get(at..)? {
            // sub $imm8,%rsp / sub $imm32,%rsp
            [0x48, 0x83, 0xec, n, ..] if *n < 0x80 => {
                offset += u64::from(*n);
                at += 4;
            }
            [0x48, 0x81, 0xec, a, b, c, d, ..] => {
                let n = i32::from_le_bytes([*a, *b, *c, *d]);
                offset += u64::try_from(n).ok()?;
                at += 7;
            }
            // A page's probe: movq $0,(%rsp) / orq $0,(%rsp).
            [0x48, 0xc7, 0x04, 0x24, 0, 0, 0, 0, ..] => at += 8,
            [0x48, 0x83, 0x0c, 0x24, 0, ..] => at += 5,
            // and $-N,%rsp (imm8 or imm32): one realignment.
            [0x48, 0x83, 0xe4, n, ..] if slack == 0 => {
                slack = alignment(i64::from(*n as i8))?;
                at += 4;
            }
            [0x48, 0x81, 0xe4, a, b, c, d, ..] if slack == 0 => {
                slack = alignment(i64::from(i32::from_le_bytes([*a, *b, *c, *d])))?;
                at += 7;
            }
            _ => break,
        }
    }
    if moves_the_stack_pointer(bytes.get(at..)?) {
        return None;
    }
    Some(RecordPlace { offset, slack })
}

/// The slack of `and $mask,%rsp`: the alignment less one, for a mask of a power of two.
#[cfg(target_arch = "x86_64")]
fn alignment(mask: i64) -> Option<u64> {
    let align = mask.checked_neg()?;
    (align > 1 && (align & (align - 1)) == 0).then(|| (align - 1) as u64)
}

/// Whether the instruction `bytes` start with writes `%rsp` (or copies it, as a probe
/// loop starts; or is `mov $N,%eax; call`, as a call of a probe function starts), or
/// pushes or pops: the prologue would not be over, or would not be the kind parsed.
#[cfg(target_arch = "x86_64")]
fn moves_the_stack_pointer(bytes: &[u8]) -> bool {
    match bytes {
        // Nothing more read: not known.
        [] => true,
        // push/pop of any register, push of an immediate, pushf/popf, enter/leave.
        [0x50..=0x5f | 0x68 | 0x6a | 0x9c | 0x9d | 0xc8 | 0xc9, ..] => true,
        [0x41, 0x50..=0x5f, ..] => true,
        // mov $N,%eax then a call: a probe function's call.
        [0xb8, _, _, _, _, 0xe8, ..] => true,
        [rex @ 0x40..=0x4f, opcode, modrm, ..] => {
            let reg = ((rex >> 2) & 1) << 3 | (modrm >> 3) & 7;
            let rm = (rex & 1) << 3 | modrm & 7;
            let register_form = modrm >> 6 == 3;
            match opcode {
                // Arithmetic, mov, test and lea with %rsp on either side, register form.
                0x01 | 0x03 | 0x09 | 0x0b | 0x21 | 0x23 | 0x29 | 0x2b | 0x31 | 0x33 | 0x81
                | 0x83 | 0x89 | 0x8b | 0xc7 | 0xf7 | 0xff => register_form && (reg == 4 || rm == 4),
                0x8d => reg == 4,
                _ => false,
            }
        }
        _ => false,
    }
}

/// Not decoded on aarch64: no record is placed from a prologue.
#[cfg(target_arch = "aarch64")]
pub(super) fn frame_record_place(_code: &Code<'_>, _start: u64) -> Option<RecordPlace> {
    None
}

/// What a call instruction calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    At(u64),
    Unknown,
}

/// The call instruction that ends just before `return_address`, if one does.
#[cfg(target_arch = "x86_64")]
fn call_before(code: &Code<'_>, return_address: u64) -> Option<Target> {
    let start = return_address.checked_sub(8)?;
    let bytes: [u8; 8] = code.read(start, true)?;
    // `E8 rel32`: relative to the return address.
    if bytes[3] == 0xe8 {
        let rel = i32::from_le_bytes(bytes[4..8].try_into().ok()?);
        // Read as direct even when the bytes could also end an indirect call: a target
        // that does not check out stops the walk, which is never false.
        return Some(Target::At(
            return_address.wrapping_add_signed(i64::from(rel)),
        ));
    }
    // `FF 15 disp32`: through a GOT slot (code built without a PLT): the slot says.
    if bytes[2] == 0xff && bytes[3] == 0x15 {
        let disp = i32::from_le_bytes(bytes[4..8].try_into().ok()?);
        let slot = return_address.wrapping_add_signed(i64::from(disp));
        return match code.read::<8>(slot, false) {
            Some(word) => Some(Target::At(u64::from_le_bytes(word))),
            None => Some(Target::Unknown),
        };
    }
    indirect_call_ends_at(&bytes).then_some(Target::Unknown)
}

/// Whether the bytes before `return_address` end an indirect call.
#[cfg(target_arch = "x86_64")]
fn indirect_call_ends_at_return(code: &Code<'_>, return_address: u64) -> bool {
    return_address
        .checked_sub(8)
        .and_then(|start| code.read::<8>(start, true))
        .is_some_and(|bytes| indirect_call_ends_at(&bytes))
}

/// Whether `bytes` end with an `FF /2` call (an optional REX prefix, the opcode, its
/// ModRM byte with reg 2, a SIB byte and displacement as ModRM asks).
#[cfg(target_arch = "x86_64")]
fn indirect_call_ends_at(bytes: &[u8; 8]) -> bool {
    (2..=7).any(|length| {
        let at = 8 - length;
        if bytes[at] != 0xff {
            return false;
        }
        let modrm = bytes[at + 1];
        if (modrm >> 3) & 7 != 2 {
            return false;
        }
        let (mode, rm) = (modrm >> 6, modrm & 7);
        let sib = usize::from(mode != 3 && rm == 4);
        let displacement = match mode {
            0 if rm == 5 => 4,
            0 if sib == 1 && bytes.get(at + 2).is_some_and(|s| s & 7 == 5) => 4,
            1 => 1,
            2 => 4,
            _ => 0,
        };
        2 + sib + displacement == length
    })
}

/// Where a PLT stub at `target` jumps: the function its GOT slot holds.
#[cfg(target_arch = "x86_64")]
fn through_stub(code: &Code<'_>, target: u64) -> Option<u64> {
    let bytes: [u8; 16] = code.read(target, true)?;
    // `jmp *disp32(%rip)`, after `endbr64` and a `bnd` prefix when the stub has them.
    let after = match bytes {
        [0xff, 0x25, ..] => 2,
        [0xf3, 0x0f, 0x1e, 0xfa, 0xff, 0x25, ..] => 6,
        [0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, ..] => 7,
        _ => return None,
    };
    let disp = i32::from_le_bytes(bytes[after..after + 4].try_into().ok()?);
    let next = target + after as u64 + 4;
    let slot = next.wrapping_add_signed(i64::from(disp));
    code.read::<8>(slot, false).map(u64::from_le_bytes)
}

/// The call instruction that ends just before `return_address`, if one does.
#[cfg(target_arch = "aarch64")]
fn call_before(code: &Code<'_>, return_address: u64) -> Option<Target> {
    let insn = u32::from_le_bytes(code.read::<4>(return_address.checked_sub(4)?, true)?);
    if insn & 0xfc00_0000 == 0x9400_0000 {
        // BL imm26: words from the call itself.
        let offset = (i64::from((insn << 6) as i32) >> 6) * 4;
        return Some(Target::At((return_address - 4).wrapping_add_signed(offset)));
    }
    // BLR Xn, and the pointer-authenticating BLRAA/BLRAB/BLRAAZ/BLRABZ.
    let blr = insn & 0xffff_fc1f == 0xd63f_0000;
    let blra = insn & 0xfeff_f800 == 0xd63f_0800;
    (blr || blra).then_some(Target::Unknown)
}

/// A `BL` cannot also be an indirect call on aarch64 (fixed-width instructions).
#[cfg(target_arch = "aarch64")]
fn indirect_call_ends_at_return(_code: &Code<'_>, _return_address: u64) -> bool {
    false
}

/// Where a PLT stub at `target` jumps: `adrp x16, page; ldr x17, [x16, offset]`
/// (after a `bti c` when the stub has one), then the function its GOT slot holds.
#[cfg(target_arch = "aarch64")]
fn through_stub(code: &Code<'_>, target: u64) -> Option<u64> {
    let bytes: [u8; 12] = code.read(target, true)?;
    let word = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap());
    let (first, at) = if word(0) == 0xd503_245f {
        (1, target + 4)
    } else {
        (0, target)
    };
    let (adrp, ldr) = (word(first), word(first + 1));
    if adrp & 0x9f00_001f != 0x9000_0010 || ldr & 0xffc0_03ff != 0xf940_0211 {
        return None;
    }
    let immhi = u64::from((adrp >> 5) & 0x7_ffff);
    let immlo = u64::from((adrp >> 29) & 3);
    let page_offset = (((immhi << 2 | immlo) << 43) as i64 >> 43) << 12;
    let page = (at & !0xfff).wrapping_add_signed(page_offset);
    let slot = page + u64::from((ldr >> 10) & 0xfff) * 8;
    code.read::<8>(slot, false).map(u64::from_le_bytes)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn ends_with_call(tail: &[u8]) -> bool {
        let mut bytes = [0x90; 8];
        bytes[8 - tail.len()..].copy_from_slice(tail);
        indirect_call_ends_at(&bytes)
    }

    #[test]
    fn indirect_calls_of_every_length_are_recognised() {
        assert!(ends_with_call(&[0xff, 0xd0]), "call *%rax");
        assert!(ends_with_call(&[0x41, 0xff, 0xd3]), "call *%r11");
        assert!(ends_with_call(&[0xff, 0x10]), "call *(%rax)");
        assert!(ends_with_call(&[0xff, 0x50, 0x18]), "call *0x18(%rax)");
        assert!(ends_with_call(&[0xff, 0x14, 0x24]), "call *(%rsp)");
        assert!(
            ends_with_call(&[0xff, 0x90, 0, 1, 0, 0]),
            "call *0x100(%rax)"
        );
        assert!(
            ends_with_call(&[0xff, 0x94, 0xc8, 0, 1, 0, 0]),
            "call *0x100(%rax,%rcx,8)"
        );
        assert!(!ends_with_call(&[0xff, 0xe0]), "jmp *%rax is no call");
        assert!(!ends_with_call(&[0x48, 0x89, 0xc7]), "mov %rax,%rdi");
        assert!(!ends_with_call(&[0xff, 0x50]), "a call cut short");
    }

    fn place(offset: u64, slack: u64) -> Option<RecordPlace> {
        Some(RecordPlace { offset, slack })
    }

    /// `bytes`, then a `mov %rdi,%rbx` (an instruction of the body).
    fn then_body(bytes: &[u8]) -> Vec<u8> {
        let mut code = bytes.to_vec();
        code.extend_from_slice(&[0x48, 0x89, 0xfb]);
        code
    }

    #[test]
    fn a_frame_record_is_placed_by_a_prologue_parsed_whole() {
        // push %rbp; mov %rsp,%rbp; push %r15; push %r14; push %r12; push %rbx;
        // sub $0x20,%rsp (the standard library's lock_contended).
        let usual = [
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x57, 0x41, 0x56, 0x41, 0x54, 0x53, 0x48, 0x83, 0xec,
            0x20,
        ];
        assert_eq!(parse_prologue(&then_body(&usual)), place(4 * 8 + 0x20, 0));
        let mut with_endbr = vec![0xf3, 0x0f, 0x1e, 0xfa];
        with_endbr.extend_from_slice(&usual);
        assert_eq!(
            parse_prologue(&then_body(&with_endbr)),
            place(4 * 8 + 0x20, 0)
        );
        // push %rax reserves a word; sub $0x1000,%rsp.
        let large = [
            0x55, 0x48, 0x89, 0xe5, 0x50, 0x48, 0x81, 0xec, 0x00, 0x10, 0x00, 0x00,
        ];
        assert_eq!(parse_prologue(&then_body(&large)), place(8 + 0x1000, 0));
        // No frame pointer: push %r14; push %rbx; push %rax.
        assert_eq!(parse_prologue(&then_body(&[0x41, 0x56, 0x53, 0x50])), None);
    }

    #[test]
    fn stack_probes_count_every_page() {
        // push %rbp; mov %rsp,%rbp; push %rbx; sub $0x1000,%rsp; movq $0,(%rsp);
        // sub $0x1000,%rsp; orq $0,(%rsp); sub $0x48,%rsp: two probed pages and the rest.
        let probed = [
            0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x81, 0xec, 0x00, 0x10, 0x00, 0x00, 0x48, 0xc7,
            0x04, 0x24, 0, 0, 0, 0, 0x48, 0x81, 0xec, 0x00, 0x10, 0x00, 0x00, 0x48, 0x83, 0x0c,
            0x24, 0x00, 0x48, 0x83, 0xec, 0x48,
        ];
        assert_eq!(
            parse_prologue(&then_body(&probed)),
            place(8 + 0x2000 + 0x48, 0)
        );
        // A probe loop: mov %rsp,%r11 after the pushes. Not parsed: unknown.
        let looped = [
            0x55, 0x48, 0x89, 0xe5, 0x53, 0x49, 0x89, 0xe3, 0x49, 0x81, 0xeb,
        ];
        assert_eq!(parse_prologue(&then_body(&looped)), None);
        // A probe function: mov $0x3000,%eax; call __rust_probestack.
        let called = [
            0x55, 0x48, 0x89, 0xe5, 0xb8, 0x00, 0x30, 0x00, 0x00, 0xe8, 0, 0, 0, 0,
        ];
        assert_eq!(parse_prologue(&then_body(&called)), None);
    }

    #[test]
    fn a_realigned_prologue_places_the_record_within_the_alignment() {
        // push %rbp; mov %rsp,%rbp; push %rbx; sub $0x18,%rsp; and $-32,%rsp.
        let realigned = [
            0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x83, 0xec, 0x18, 0x48, 0x83, 0xe4, 0xe0,
        ];
        assert_eq!(parse_prologue(&then_body(&realigned)), place(8 + 0x18, 31));
        // and $-64,%rsp; sub $0x100,%rsp.
        let then_sub = [
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xe4, 0xc0, 0x48, 0x81, 0xec, 0x00, 0x01, 0x00,
            0x00,
        ];
        assert_eq!(parse_prologue(&then_body(&then_sub)), place(0x100, 63));
    }

    #[test]
    fn anything_after_the_prologue_that_moves_the_stack_pointer_is_unknown() {
        let prologue = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20];
        for (after, what) in [
            (&[0x48, 0x29, 0xc4][..], "sub %rax,%rsp (alloca)"),
            (&[0x48, 0x89, 0xc4], "mov %rax,%rsp"),
            (&[0x48, 0x8d, 0x64, 0x24, 0xf0], "lea -0x10(%rsp),%rsp"),
            (&[0x6a, 0x00], "push $0 (a pushed argument)"),
            (&[0x41, 0x54], "push %r12 after the sub"),
            (
                &[0x48, 0x83, 0xe4, 0xc0, 0x48, 0x83, 0xe4, 0xc0],
                "two realignments",
            ),
            (&[], "the prologue's end not read"),
        ] {
            let mut code = prologue.to_vec();
            code.extend_from_slice(after);
            assert_eq!(parse_prologue(&code), None, "{what}");
        }
        // %r12 is not %rsp: `mov %rax,%r12` is the body.
        let mut code = prologue.to_vec();
        code.extend_from_slice(&[0x49, 0x89, 0xc4]);
        assert_eq!(parse_prologue(&code), place(0x20, 0));
    }

    #[test]
    fn fde_encodings_are_read_from_the_cie() {
        // length, id 0, version 1, "zR", code align 1, data align -8, ra 16, aug len 1,
        // R = pcrel sdata4.
        let cie = [
            0x14, 0, 0, 0, 0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b,
        ];
        assert_eq!(fde_encoding(&cie), Some(0x1b));
        let plain = [0x10, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0x78, 16];
        assert_eq!(fde_encoding(&plain), Some(0x00));
    }
}
