//! Container log files: one line per output line, `<RFC 3339 UTC, ms> <stream> <line>`,
//! rotated by size. `max_files` counts the current file too: with 3, the shim keeps
//! `container.log`, `container.log.1` (newest rotated) and `container.log.2`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use chrono::{SecondsFormat, Utc};

/// A line longer than this is written in pieces (each piece is a record of its own).
pub(crate) const MAX_LINE: usize = 16 * 1024;

pub(crate) struct RotatingLog {
    path: PathBuf,
    max_bytes: u64,
    max_files: usize,
    file: File,
    size: u64,
}

impl RotatingLog {
    pub(crate) fn open(path: &Path, max_bytes: u64, max_files: usize) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            max_files: max_files.max(1),
            file,
            size,
        })
    }

    /// Appends one record, rotating first if it would push the file past `max_bytes`.
    pub(crate) fn write_line(&mut self, stream: &str, line: &[u8]) -> io::Result<()> {
        let ts = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut record = Vec::with_capacity(ts.len() + stream.len() + line.len() + 3);
        record.extend_from_slice(ts.as_bytes());
        record.push(b' ');
        record.extend_from_slice(stream.as_bytes());
        record.push(b' ');
        record.extend_from_slice(line);
        record.push(b'\n');
        if self.size > 0 && self.size + record.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&record)?;
        self.size += record.len() as u64;
        Ok(())
    }

    fn rotated(&self, n: usize) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.max_files > 1 {
            // Drop the oldest, shift the rest up by one, current becomes .1.
            let oldest = self.max_files - 1;
            match fs::remove_file(self.rotated(oldest)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            for n in (1..oldest).rev() {
                match fs::rename(self.rotated(n), self.rotated(n + 1)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            fs::rename(&self.path, self.rotated(1))?;
        }
        self.file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

/// Splits a byte stream into lines (without the newline); long lines come out in
/// `MAX_LINE` pieces.
#[derive(Default)]
pub(crate) struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    pub(crate) fn feed(&mut self, data: &[u8], mut emit: impl FnMut(&[u8])) {
        self.buf.extend_from_slice(data);
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|b| *b == b'\n') {
            emit(&self.buf[start..start + pos]);
            start += pos + 1;
        }
        while self.buf.len() - start >= MAX_LINE {
            emit(&self.buf[start..start + MAX_LINE]);
            start += MAX_LINE;
        }
        self.buf.drain(..start);
    }

    /// Emits what is left (a last line without newline).
    pub(crate) fn finish(&mut self, mut emit: impl FnMut(&[u8])) {
        if !self.buf.is_empty() {
            emit(&self.buf);
            self.buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_across_chunks() {
        let mut s = LineSplitter::default();
        let mut out: Vec<Vec<u8>> = Vec::new();
        s.feed(b"ab", |l| out.push(l.to_vec()));
        s.feed(b"c\nde\n\nf", |l| out.push(l.to_vec()));
        s.finish(|l| out.push(l.to_vec()));
        assert_eq!(out, [&b"abc"[..], b"de", b"", b"f"]);
        let long = vec![b'x'; MAX_LINE + 5];
        out.clear();
        s.feed(&long, |l| out.push(l.to_vec()));
        s.finish(|l| out.push(l.to_vec()));
        assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), [MAX_LINE, 5]);
    }

    #[test]
    fn rotates_by_size_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        let mut log = RotatingLog::open(&path, 200, 3).unwrap();
        for i in 0..40 {
            log.write_line("stdout", format!("line {i:03}").as_bytes())
                .unwrap();
        }
        let len = |p: &Path| fs::metadata(p).unwrap().len();
        assert!(len(&path) <= 200);
        assert!(len(&log.rotated(1)) <= 200);
        assert!(log.rotated(2).exists());
        assert!(!log.rotated(3).exists(), "only max_files files are kept");
        let current = fs::read_to_string(&path).unwrap();
        let last = current.lines().last().unwrap();
        assert!(last.ends_with(" stdout line 039"), "{last}");
        let ts = last.split(' ').next().unwrap();
        assert!(chrono::DateTime::parse_from_rfc3339(ts).is_ok(), "{ts}");
        assert!(ts.ends_with('Z') && ts.len() == "2026-11-22T05:00:00.123Z".len());
    }
}
