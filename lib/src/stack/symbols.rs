//! Resolves captured instruction pointers to functions, files and lines in bounded memory.
//!
//! A release binary's debug info is zlib-compressed, and every DWARF reader inflates it
//! whole before it looks anything up: about 190 MB more for this repository's binary, at
//! the very moment a hang is diagnosed. So the binary's file and line information is
//! read from a GSYM symbol file beside it instead (`BINARY.gsym`, made at build time by
//! `llvm-gsymutil --convert`): an address table searched in place and one function's
//! line table and inline tree decoded per lookup, all through a read-only mapping, so
//! only the few pages touched become resident. blazesym reads it. Without that file the
//! symbol table still names each function (no file, line or inlined calls), and the
//! stack says which file it lacks and how to resolve the addresses offline; DWARF is
//! read only when its sections are uncompressed (debug builds), where nothing is
//! inflated. docs/performance.md has the figures and the other designs weighed.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use blazesym::symbolize::source::{Elf, GsymFile, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized, Symbolizer};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::maps::Maps;
use super::{Frame, MissingSymbols, short_path};

/// The frames of a batch of addresses, and where each address lies.
pub(super) struct Resolved {
    /// Per address, in the order given: its frames, innermost (inlined) first; one
    /// without a name when nothing was found.
    pub(super) frames: Vec<Vec<Frame>>,
    /// Per address: the index of its file in `files` and the address within that file.
    places: Vec<Option<(usize, u64)>>,
    files: Vec<MappedFile>,
    /// Whether resolving stopped at the deadline, before the addresses (or the last
    /// wanted) were all resolved.
    pub(super) deadline_passed: bool,
}

/// One mapped file that addresses of the batch lie in.
#[derive(Clone)]
struct MappedFile {
    path: String,
    build_id: Option<String>,
    source: SymbolSource,
    /// Whether it is the program's executable (not a shared library).
    executable: bool,
}

/// Where a file's frames got their names, files and lines from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SymbolSource {
    /// `FILE.gsym`: names, files, lines and inlined calls.
    SymbolFile,
    /// Uncompressed DWARF in the file itself: the same.
    Dwarf,
    /// The ELF symbol table only: function names.
    SymbolTable,
}

impl Resolved {
    /// The files of the first `count` addresses whose frames lack files and lines
    /// for want of symbols: the executable without a symbol file, and any file of
    /// which a frame has no name at all.
    pub(super) fn missing(&self, count: usize) -> Vec<MissingSymbols> {
        let mut missing: Vec<(usize, MissingSymbols)> = Vec::new();
        for (at, place) in self.places.iter().enumerate().take(count) {
            let Some((index, address)) = *place else {
                continue;
            };
            let file = &self.files[index];
            if file.source != SymbolSource::SymbolTable {
                continue;
            }
            let unnamed = self.frames[at].iter().all(|f| f.function.is_none());
            match missing.iter_mut().find(|(i, _)| *i == index) {
                Some((_, entry)) => entry.addresses.push(address),
                None if file.executable || unnamed => missing.push((
                    index,
                    MissingSymbols {
                        file: file.path.clone(),
                        build_id: file.build_id.clone(),
                        addresses: vec![address],
                    },
                )),
                None => {}
            }
        }
        missing.into_iter().map(|(_, entry)| entry).collect()
    }
}

/// What one capture resolves symbols with: the memory map, read once, and each file's
/// symbols, opened once (blazesym keeps what it parsed until the session is dropped).
pub(super) struct Session {
    maps: Maps,
    symbolizer: Symbolizer,
    files: Vec<MappedFile>,
    /// Per file in `files`: where its segments lie in it, or nothing if unreadable.
    facts: Vec<Option<ElfFacts>>,
    executable: Option<PathBuf>,
}

impl Session {
    pub(super) fn new() -> Self {
        Self {
            maps: Maps::read().unwrap_or_default(),
            symbolizer: Symbolizer::builder()
                .set_debug_dirs(Option::<&[&Path]>::None)
                .build(),
            files: Vec::new(),
            facts: Vec::new(),
            executable: std::env::current_exe().ok(),
        }
    }

    /// The index in `files` of the mapped file at `path`, read on first use.
    fn file(&mut self, path: &str) -> usize {
        if let Some(index) = self.files.iter().position(|f| f.path == path) {
            return index;
        }
        let read = ElfFacts::read(Path::new(path));
        let source = match &read {
            Some(elf) if elf.build_id.is_some() && gsym_uuid(&gsym_path(path)) == elf.build_id => {
                SymbolSource::SymbolFile
            }
            Some(elf) if elf.plain_dwarf => SymbolSource::Dwarf,
            _ => SymbolSource::SymbolTable,
        };
        self.files.push(MappedFile {
            path: path.to_owned(),
            build_id: read.as_ref().and_then(|elf| elf.build_id.clone()),
            source,
            executable: self
                .executable
                .as_deref()
                .is_some_and(|exe| exe == Path::new(path)),
        });
        self.facts.push(read);
        self.files.len() - 1
    }

    /// Resolves `(ip, lookup)` pairs from the innermost out, up to and with the first
    /// whose frames `is_last` picks, and no further once `deadline` has passed: the
    /// frame is shown at `ip` and looked up at `lookup` (a return address less one, so
    /// that it falls in the call). What lies below is left alone: the runtime's outer
    /// functions inline most of it, and their inline trees are the largest part of the
    /// symbol file that a lookup would read.
    pub(super) fn resolve(
        &mut self,
        addresses: &[(usize, usize)],
        is_last: &dyn Fn(&Frame) -> bool,
        deadline: Instant,
    ) -> Resolved {
        let mut places = Vec::with_capacity(addresses.len());
        let mut frames: Vec<Vec<Frame>> = Vec::with_capacity(addresses.len());
        let mut deadline_passed = false;
        // Per frame of the executable named from its symbol table: the file and where
        // the function starts, to look for other functions that start there too.
        let mut named_at: Vec<(usize, usize, u64)> = Vec::new();
        for &(ip, lookup_at) in addresses {
            if Instant::now() >= deadline {
                deadline_passed = true;
                break;
            }
            let mut found = Vec::new();
            let mut place = None;
            let located = self
                .maps
                .file_offset(lookup_at as u64)
                .map(|(path, offset)| (path.to_owned(), offset));
            if let Some((path, offset)) = located {
                let index = self.file(&path);
                if let Some(address) = self.facts[index]
                    .as_ref()
                    .and_then(|f| f.address_of(offset))
                {
                    place = Some((index, address));
                    let start;
                    (found, start) = self.frames_at(index, ip, address);
                    if let Some(start) = start.filter(|_| self.files[index].executable) {
                        named_at.push((frames.len(), index, start));
                    }
                }
            }
            if found.is_empty() {
                found.push(Frame {
                    ip,
                    function: None,
                    file: None,
                    line: None,
                });
            }
            let last = found.iter().any(is_last);
            frames.push(found);
            places.push(place);
            if last {
                break;
            }
        }
        self.say_when_shared(&mut frames, &named_at);
        Resolved {
            frames,
            places,
            files: self.files.clone(),
            deadline_passed,
        }
    }

    /// Adds `(or N others with the same code)` to the name of each frame of `named_at`
    /// (frame, file, function start) whose start is also the start of other functions
    /// in its file's symbol table: code folded by the linker, or one generic body for
    /// several types. The name shown is one of them, as the symbol table gave it.
    fn say_when_shared(&self, frames: &mut [Vec<Frame>], named_at: &[(usize, usize, u64)]) {
        let mut files: Vec<usize> = named_at.iter().map(|&(_, file, _)| file).collect();
        files.sort_unstable();
        files.dedup();
        for file in files {
            let mut starts: Vec<u64> = named_at
                .iter()
                .filter(|&&(_, f, _)| f == file)
                .map(|&(_, _, start)| start)
                .collect();
            starts.sort_unstable();
            starts.dedup();
            let names = functions_starting_at(Path::new(&self.files[file].path), &starts);
            for &(frame, _, start) in named_at.iter().filter(|&&(_, f, _)| f == file) {
                let others = names
                    .iter()
                    .filter(|(at, _)| *at == start)
                    .count()
                    .saturating_sub(1);
                if let Some(outer) = frames[frame].last_mut().filter(|_| others > 0)
                    && let Some(function) = &mut outer.function
                {
                    let others = match others {
                        1 => "1 other".to_owned(),
                        n => format!("{n} others"),
                    };
                    function.push_str(&format!(" (or {others} with the same code)"));
                }
            }
        }
    }

    /// The frames at `address` of file `index` (shown at `ip`), and where the function
    /// starts when its name is the symbol table's.
    fn frames_at(&self, index: usize, ip: usize, address: u64) -> (Vec<Frame>, Option<u64>) {
        let file = &self.files[index];
        let at = [address];
        let table = lookup(&self.symbolizer, &elf_source(&file.path, false), &at);
        let table = table.first().and_then(Symbolized::as_sym);
        let detailed = match file.source {
            SymbolSource::SymbolFile => lookup(
                &self.symbolizer,
                &GsymFile::new(gsym_path(&file.path)).into(),
                &at,
            ),
            SymbolSource::Dwarf => lookup(&self.symbolizer, &elf_source(&file.path, true), &at),
            SymbolSource::SymbolTable => Vec::new(),
        };
        match (detailed.first().and_then(Symbolized::as_sym), table) {
            (Some(sym), table) => (
                frames_of(ip, sym, table),
                table.filter(|t| t.addr == sym.addr).map(|t| t.addr),
            ),
            (None, Some(sym)) => (frames_of(ip, sym, None), Some(sym.addr)),
            (None, None) => (Vec::new(), None),
        }
    }
}

/// Where the symbol file of the file at `path` is: beside it, named after it.
fn gsym_path(path: &str) -> PathBuf {
    PathBuf::from(format!("{path}.gsym"))
}

fn elf_source(path: &str, debug_syms: bool) -> Source<'static> {
    let mut elf = Elf::new(path);
    elf.debug_syms = debug_syms;
    elf.into()
}

/// One result per address; none at all when the source cannot be read.
fn lookup<'s>(symbolizer: &'s Symbolizer, source: &Source<'_>, at: &[u64]) -> Vec<Symbolized<'s>> {
    symbolizer
        .symbolize(source, Input::VirtOffset(at))
        .unwrap_or_default()
}

/// The frames of one address: the inlined calls innermost first, then the function
/// they were inlined into. Each names where in itself the address (or the call to
/// the next inner frame) is. The outer function takes the symbol table's name when
/// it is the same function: that one carries the module path.
fn frames_of(ip: usize, sym: &Sym<'_>, table: Option<&Sym<'_>>) -> Vec<Frame> {
    let location = |info: Option<&CodeInfo<'_>>| match info {
        Some(info) => (Some(short_path(&info.to_path())), info.line),
        None => (None, None),
    };
    let mut frames = Vec::with_capacity(sym.inlined.len() + 1);
    for inlined in sym.inlined.iter().rev() {
        let (file, line) = location(inlined.code_info.as_ref());
        frames.push(Frame {
            ip,
            function: Some(inlined.name.to_string()),
            file,
            line,
        });
    }
    let outer = match table {
        Some(table) if table.addr == sym.addr => &table.name,
        _ => &sym.name,
    };
    let (file, line) = location(sym.code_info.as_deref());
    frames.push(Frame {
        ip,
        function: Some(outer.to_string()),
        file,
        line,
    });
    frames
}

/// The distinct names (without a symbol version) of the functions in the symbol table
/// of the file at `path` that start at one of `starts` (sorted), each with its start.
/// One pass over the table's entries; names are read for those that match only.
fn functions_starting_at(path: &Path, starts: &[u64]) -> Vec<(u64, String)> {
    let Ok(file) = File::open(path) else {
        return Vec::new();
    };
    let cache = object::read::ReadCache::new(file);
    let Ok(elf) = object::File::parse(&cache) else {
        return Vec::new();
    };
    let mut names: Vec<(u64, String)> = Vec::new();
    for symbol in elf.symbols() {
        if symbol.kind() != SymbolKind::Text || starts.binary_search(&symbol.address()).is_err() {
            continue;
        }
        let Ok(name) = symbol.name() else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        let at = symbol.address();
        if !names.iter().any(|(a, n)| *a == at && n == name) {
            names.push((at, name.to_owned()));
        }
    }
    names
}

/// The build id of a GSYM file's header (its UUID), if the file is there.
fn gsym_uuid(path: &Path) -> Option<String> {
    // magic, version, address offset size, UUID size, base address, address count,
    // string table offset and size, then the UUID (at most 20 bytes).
    let mut header = [0; 48];
    File::open(path).ok()?.read_exact(&mut header).ok()?;
    if &header[..4] != b"MYSG" && &header[..4] != b"GSYM" {
        return None;
    }
    let size = usize::from(header[7]).min(20);
    (size > 0).then(|| hex(&header[28..28 + size]))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What is read of a mapped ELF file: no section data.
struct ElfFacts {
    /// `(file offset, file size, address)` of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    build_id: Option<String>,
    /// Whether it has DWARF debug info that is not compressed.
    plain_dwarf: bool,
}

impl ElfFacts {
    fn read(path: &Path) -> Option<Self> {
        let cache = object::read::ReadCache::new(File::open(path).ok()?);
        let elf = object::File::parse(&cache).ok()?;
        let segments = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let build_id = elf.build_id().ok().flatten().map(hex);
        let plain_dwarf = elf.section_by_name(".debug_info").is_some_and(|s| {
            s.compressed_file_range()
                .is_ok_and(|r| r.format == object::CompressionFormat::None)
        });
        Some(Self {
            segments,
            build_id,
            plain_dwarf,
        })
    }

    /// The address in the file (as its symbols name it) of the byte at `offset`.
    fn address_of(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(start, size, _)| (*start..start + size).contains(&offset))
            .map(|(start, _, address)| address + (offset - start))
    }
}

/// Returns the heap that symbolization freed to the kernel.
pub(super) fn release() {
    trim_heap();
}

/// Returns the free memory at the top of every malloc arena to the kernel (glibc keeps
/// it otherwise).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    #[test]
    fn a_function_of_this_binary_is_named() {
        let ip = a_function_of_this_binary_is_named as *const () as usize;
        let resolved = Session::new().resolve(&[(ip, ip)], &|_| false, far());
        let frames = &resolved.frames[0];
        assert!(
            frames.iter().any(|f| f
                .function
                .as_deref()
                .is_some_and(|n| n.contains("a_function_of_this_binary_is_named"))),
            "{frames:?}"
        );
        // A test binary has its DWARF uncompressed: nothing is reported missing.
        assert!(resolved.missing(1).is_empty());
    }

    /// A function with a second name at its start, as the symbol table of code folded
    /// by the linker (or one generic body for several types) has.
    #[inline(never)]
    fn a_function_with_a_second_name() -> u32 {
        std::hint::black_box(7)
    }

    std::arch::global_asm!(
        ".globl reconcile_watchdog_second_name_of_a_function",
        ".type reconcile_watchdog_second_name_of_a_function, %function",
        ".set reconcile_watchdog_second_name_of_a_function, {f}",
        f = sym a_function_with_a_second_name,
    );

    #[test]
    fn a_function_whose_code_has_another_name_says_so() {
        let ip = a_function_with_a_second_name as *const () as usize;
        let resolved = Session::new().resolve(&[(ip, ip)], &|_| false, far());
        let outer = resolved.frames[0].last().expect("a frame");
        let name = outer.function.as_deref().unwrap_or_default();
        assert!(
            name.ends_with(" (or 1 other with the same code)"),
            "{:?}",
            resolved.frames[0]
        );
        // A function with one name is not marked.
        let ip = an_address_in_no_file_is_a_frame_without_a_name as *const () as usize;
        let resolved = Session::new().resolve(&[(ip, ip)], &|_| false, far());
        let name = resolved.frames[0].last().and_then(|f| f.function.clone());
        assert!(
            name.as_deref()
                .is_some_and(|n| !n.contains("with the same code")),
            "{name:?}"
        );
    }

    #[test]
    fn an_address_in_no_file_is_a_frame_without_a_name() {
        let resolved = Session::new().resolve(&[(0x10, 0x10)], &|_| false, far());
        assert_eq!(resolved.frames[0].len(), 1);
        assert_eq!(resolved.frames[0][0].function, None);
        assert_eq!(resolved.frames[0][0].ip, 0x10);
        assert!(resolved.missing(1).is_empty());
    }
}
