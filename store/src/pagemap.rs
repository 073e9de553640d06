//! CRIU's page maps, read so that a snapshot's memory can be served page
//! by page while it is still being fetched (`stream`).
//!
//! A task's `pagemap-<pid>.img` lists the runs of its pages that the dump
//! saved, in address order; their contents follow one another in
//! `pages-<pages_id>.img` (a run's bytes are there only when it is
//! `PE_PRESENT`). A run marked `PE_LAZY` is one `criu restore
//! --lazy-pages` leaves to the lazy-pages daemon; every other run is read
//! by the restore itself, from the local file.
//!
//! The image comes from the object tier: it is hostile input. Its size,
//! its number of runs and every run's bounds are checked, and an image
//! that does not parse is refused naming what is wrong.

use prost::Message;

/// `IMG_COMMON_MAGIC`, then `PAGEMAP_MAGIC` (criu/include/magic.h).
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
const PAGEMAP_MAGIC: u32 = 0x5608_4025;

/// Run flags (criu/include/pagemap.h).
pub const PE_PARENT: u32 = 1 << 0;
pub const PE_LAZY: u32 = 1 << 1;
pub const PE_PRESENT: u32 = 1 << 2;

pub const PAGE_SIZE: u64 = 4096;

/// A page map larger than this is refused unread (a 64 GiB process in
/// single-page runs would be ~300 MiB of map; real ones are far smaller).
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

/// criu/images/pagemap.proto `pagemap_head`.
#[derive(Clone, PartialEq, Message)]
struct PagemapHead {
    #[prost(uint32, required, tag = "1")]
    pages_id: u32,
}

/// criu/images/pagemap.proto `pagemap_entry`.
#[derive(Clone, PartialEq, Message)]
struct PagemapEntry {
    #[prost(uint64, required, tag = "1")]
    vaddr: u64,
    #[prost(uint32, required, tag = "2")]
    compat_nr_pages: u32,
    #[prost(bool, optional, tag = "3")]
    in_parent: Option<bool>,
    #[prost(uint32, optional, tag = "4")]
    flags: Option<u32>,
    #[prost(uint64, optional, tag = "5")]
    nr_pages: Option<u64>,
}

/// One run of pages of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub vaddr: u64,
    pub pages: u64,
    pub flags: u32,
    /// Where its bytes start in the pages file (when `PE_PRESENT`).
    pub offset: u64,
}

impl Run {
    pub fn lazy(&self) -> bool {
        self.flags & PE_LAZY != 0
    }
    pub fn present(&self) -> bool {
        self.flags & PE_PRESENT != 0
    }
    fn end(&self) -> u64 {
        self.vaddr + self.pages * PAGE_SIZE
    }
}

/// A task's page map: its pages file and its runs, sorted, disjoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pagemap {
    pub pages_id: u32,
    pub runs: Vec<Run>,
}

impl Pagemap {
    /// Parses a `pagemap-<pid>.img`. `pages_file_size` bounds the runs'
    /// bytes (they must fit in the pages file the manifest describes).
    pub fn parse(img: &[u8], pages_file_size: u64) -> Result<Pagemap, String> {
        if img.len() as u64 > MAX_IMAGE_BYTES {
            return Err(format!("page map of {} bytes is over the {MAX_IMAGE_BYTES}-byte limit", img.len()));
        }
        let mut r = Reader { buf: img, at: 0 };
        let (m1, m2) = (r.u32()?, r.u32()?);
        if m1 != IMG_COMMON_MAGIC || m2 != PAGEMAP_MAGIC {
            return Err(format!("not a CRIU page map (magic {m1:#010x} {m2:#010x})"));
        }
        let head = PagemapHead::decode(r.entry()?.ok_or("page map has no head")?).map_err(|e| format!("page map head: {e}"))?;
        let mut runs: Vec<Run> = Vec::new();
        let mut offset = 0u64;
        while let Some(bytes) = r.entry()? {
            let n = runs.len();
            let e = PagemapEntry::decode(bytes).map_err(|e| format!("page map run #{n}: {e}"))?;
            // As criu/pagemap.c init_compat_pagemap_entry reads older maps.
            let flags = match (e.in_parent, e.flags) {
                (Some(true), f) => f.unwrap_or(0) | PE_PARENT,
                (_, Some(f)) => f,
                (_, None) => PE_PRESENT,
            };
            let pages = e.nr_pages.unwrap_or(e.compat_nr_pages as u64);
            let run = Run { vaddr: e.vaddr, pages, flags, offset };
            if pages == 0 || !e.vaddr.is_multiple_of(PAGE_SIZE) || e.vaddr.checked_add(pages.saturating_mul(PAGE_SIZE)).is_none() {
                return Err(format!("page map run #{n} ({:#x}, {pages} pages) is malformed", e.vaddr));
            }
            if let Some(prev) = runs.last() {
                if prev.end() > run.vaddr {
                    return Err(format!("page map run #{n} at {:#x} overlaps or precedes the one before it", run.vaddr));
                }
            }
            if run.present() {
                offset = offset
                    .checked_add(pages * PAGE_SIZE)
                    .filter(|o| *o <= pages_file_size)
                    .ok_or_else(|| format!("page map runs up to #{n} need more than the pages file's {pages_file_size} bytes"))?;
            }
            runs.push(run);
        }
        Ok(Pagemap { pages_id: head.pages_id, runs })
    }

    /// The bytes of the pages file that hold `nr` pages from `vaddr`, cut
    /// at the end of the run that holds `vaddr`: `(offset, pages)`, or
    /// `None` when no present run holds it.
    pub fn locate(&self, vaddr: u64, nr: u64) -> Option<(u64, u64)> {
        let i = self.runs.partition_point(|r| r.end() <= vaddr);
        let run = self.runs.get(i).filter(|r| r.vaddr <= vaddr && r.present())?;
        if !vaddr.is_multiple_of(PAGE_SIZE) || nr == 0 {
            return None;
        }
        let skip = (vaddr - run.vaddr) / PAGE_SIZE;
        Some((run.offset + skip * PAGE_SIZE, nr.min(run.pages - skip)))
    }

    /// Byte ranges of the pages file the restore reads itself (present,
    /// not lazy), merged.
    pub fn eager_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for r in self.runs.iter().filter(|r| r.present() && !r.lazy()) {
            let (start, end) = (r.offset, r.offset + r.pages * PAGE_SIZE);
            match out.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => out.push((start, end)),
            }
        }
        out
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.buf.get(self.at..self.at + 4).ok_or_else(|| format!("page map truncated at byte {}", self.at))?;
        self.at += 4;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The next size-prefixed entry; `None` at the end.
    fn entry(&mut self) -> Result<Option<&'a [u8]>, String> {
        if self.at == self.buf.len() {
            return Ok(None);
        }
        let len = self.u32()? as usize;
        let b = self
            .buf
            .get(self.at..self.at + len)
            .ok_or_else(|| format!("page map entry of {len} bytes at byte {} runs past its end", self.at - 4))?;
        self.at += len;
        Ok(Some(b))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A page map image as CRIU writes it: `(vaddr, pages, flags)` runs.
    pub(crate) fn image(pages_id: u32, runs: &[(u64, u64, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&IMG_COMMON_MAGIC.to_le_bytes());
        out.extend_from_slice(&PAGEMAP_MAGIC.to_le_bytes());
        let mut put = |b: Vec<u8>| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(&b);
        };
        put(PagemapHead { pages_id }.encode_to_vec());
        for &(vaddr, pages, flags) in runs {
            put(PagemapEntry { vaddr, compat_nr_pages: pages as u32, in_parent: None, flags: Some(flags), nr_pages: Some(pages) }
                .encode_to_vec());
        }
        out
    }

    #[test]
    fn parses_runs_and_locates_pages() {
        let img = image(3, &[(0x1000, 2, PE_PRESENT), (0x10000, 4, PE_PRESENT | PE_LAZY), (0x20000, 1, PE_PRESENT)]);
        let m = Pagemap::parse(&img, 7 * PAGE_SIZE).unwrap();
        assert_eq!(m.pages_id, 3);
        assert_eq!(m.runs.len(), 3);
        assert_eq!(m.locate(0x1000, 1), Some((0, 1)));
        assert_eq!(m.locate(0x2000, 8), Some((PAGE_SIZE, 1)), "cut at the run's end");
        assert_eq!(m.locate(0x11000, 100), Some((3 * PAGE_SIZE, 3)));
        assert_eq!(m.locate(0x20000, 1), Some((6 * PAGE_SIZE, 1)));
        assert_eq!(m.locate(0x3000, 1), None, "between runs");
        assert_eq!(m.locate(0x30000, 1), None, "past the last run");
        assert_eq!(m.locate(0x1001, 1), None, "unaligned");
        assert_eq!(m.eager_ranges(), vec![(0, 2 * PAGE_SIZE), (6 * PAGE_SIZE, 7 * PAGE_SIZE)]);
    }

    #[test]
    fn older_maps_default_to_present() {
        let mut img = image(1, &[]);
        let e = PagemapEntry { vaddr: 0x4000, compat_nr_pages: 2, in_parent: None, flags: None, nr_pages: None }.encode_to_vec();
        img.extend_from_slice(&(e.len() as u32).to_le_bytes());
        img.extend_from_slice(&e);
        let m = Pagemap::parse(&img, 2 * PAGE_SIZE).unwrap();
        assert_eq!(m.runs, vec![Run { vaddr: 0x4000, pages: 2, flags: PE_PRESENT, offset: 0 }]);
    }

    #[test]
    fn hostile_maps_are_refused_naming_the_problem() {
        assert!(Pagemap::parse(b"nope", 0).unwrap_err().contains("truncated") || Pagemap::parse(b"nope", 0).is_err());
        assert!(Pagemap::parse(&[0u8; 8], 0).unwrap_err().contains("not a CRIU page map"));
        let img = image(1, &[(0x1000, 4, PE_PRESENT)]);
        assert!(Pagemap::parse(&img, PAGE_SIZE).unwrap_err().contains("pages file"), "runs past the pages file");
        let img = image(1, &[(0x4000, 4, PE_PRESENT), (0x5000, 1, PE_PRESENT)]);
        assert!(Pagemap::parse(&img, 10 * PAGE_SIZE).unwrap_err().contains("overlaps"));
        let img = image(1, &[(0x4001, 1, PE_PRESENT)]);
        assert!(Pagemap::parse(&img, 10 * PAGE_SIZE).unwrap_err().contains("malformed"));
        let img = image(1, &[(u64::MAX - 4095, 2, PE_PRESENT)]);
        assert!(Pagemap::parse(&img, 10 * PAGE_SIZE).unwrap_err().contains("malformed"));
        let mut img = image(1, &[(0x1000, 1, PE_PRESENT)]);
        img.truncate(img.len() - 2);
        assert!(Pagemap::parse(&img, 10 * PAGE_SIZE).unwrap_err().contains("runs past"));
    }
}
