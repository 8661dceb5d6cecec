//! This process's memory map (`/proc/self/maps`), as the unwinder, the checks of its
//! steps and the symbolizer read it.

use std::io;
use std::ops::Range;

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Mapping {
    pub(super) range: Range<u64>,
    pub(super) executable: bool,
    pub(super) offset: u64,
    pub(super) path: Option<String>,
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

    /// The mapping `address` is in, when it is one of a loaded object (a file that is
    /// mapped with code somewhere, or the vDSO): its range and whether it is executable.
    /// Never a mapping of a data file, which could be on a hung network filesystem.
    pub(super) fn of_loaded_object(&self, address: u64) -> Option<(Range<u64>, bool)> {
        let m = self.containing(address)?;
        let path = m.path.as_deref()?;
        let loaded = (path.starts_with('/') || path == VDSO)
            && self
                .0
                .iter()
                .any(|other| other.executable && other.path.as_deref() == Some(path));
        loaded.then(|| (m.range.clone(), m.executable))
    }

    pub(super) fn containing(&self, address: u64) -> Option<&Mapping> {
        self.0.iter().find(|m| m.range.contains(&address))
    }

    /// The files mapped with code, each with its mappings, and the vDSO (the kernel's
    /// code in every process, `clock_gettime` among it): what the unwinder needs unwind
    /// tables from.
    pub(super) fn code_files(&self) -> Vec<(String, Vec<&Mapping>)> {
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
pub(super) const VDSO: &str = "[vdso]";

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

    #[test]
    fn code_and_slots_are_read_from_loaded_objects_only() {
        let maps = Maps(
            [
                "1000-2000 r--p 00000000 08:01 7 /usr/lib/libc.so.6",
                "2000-3000 r-xp 00001000 08:01 7 /usr/lib/libc.so.6",
                "5000-6000 r--s 00000000 00:31 9 /mnt/nfs/data.bin",
                "7000-8000 rw-p 00000000 00:00 0",
            ]
            .into_iter()
            .filter_map(parse_mapping)
            .collect(),
        );
        assert_eq!(maps.of_loaded_object(0x1008), Some((0x1000..0x2000, false)));
        assert_eq!(maps.of_loaded_object(0x2008), Some((0x2000..0x3000, true)));
        assert_eq!(maps.of_loaded_object(0x5008), None, "a data file");
        assert_eq!(maps.of_loaded_object(0x7008), None, "anonymous");
    }
}
