//! Reading container logs as the shim writes them (see `runtime::log`): one record per line,
//! `<RFC 3339 time> <stdout|stderr> <text>`, in `container.log` with rotated copies
//! `container.log.1` (newest) … `container.log.N` (oldest).
//!
//! [`LogReader`] serves the agent's logs endpoint: everything or the last N lines across the
//! rotated files, then (to follow) whatever is appended, surviving rotations.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Read size for log files.
const CHUNK: usize = 64 * 1024;

/// Turns records into the lines a reader sees: the text alone, or `<time> <text>` with
/// `timestamps` (kubectl's `--timestamps`; the stream name is dropped either way). Holds an
/// incomplete last record until its newline arrives.
#[derive(Debug, Default)]
pub struct LineFormatter {
    timestamps: bool,
    pending: Vec<u8>,
}

impl LineFormatter {
    pub fn new(timestamps: bool) -> Self {
        LineFormatter {
            timestamps,
            pending: Vec::new(),
        }
    }

    /// Appends the formatted form of one record (without its newline) plus `\n` to `out`.
    pub fn record(&self, record: &[u8], out: &mut Vec<u8>) {
        match split_record(record) {
            Some((ts, text)) => {
                if self.timestamps {
                    out.extend_from_slice(ts);
                    out.push(b' ');
                }
                out.extend_from_slice(text);
            }
            // Not in the shim's format: pass it on as it is.
            None => out.extend_from_slice(record),
        }
        out.push(b'\n');
    }

    /// Feeds raw file bytes; appends every record they complete to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let mut rest = data;
        while let Some(pos) = rest.iter().position(|b| *b == b'\n') {
            if self.pending.is_empty() {
                self.record(&rest[..pos], out);
            } else {
                self.pending.extend_from_slice(&rest[..pos]);
                let rec = std::mem::take(&mut self.pending);
                self.record(&rec, out);
            }
            rest = &rest[pos + 1..];
        }
        self.pending.extend_from_slice(rest);
    }
}

/// `(timestamp, text)` of a `<time> <stream> <text>` record.
fn split_record(record: &[u8]) -> Option<(&[u8], &[u8])> {
    let sp1 = record.iter().position(|b| *b == b' ')?;
    let (ts, rest) = (&record[..sp1], &record[sp1 + 1..]);
    if !ts.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    for stream in [&b"stdout"[..], b"stderr"] {
        if let Some(after) = rest.strip_prefix(stream) {
            if after.is_empty() {
                return Some((ts, after));
            }
            if let Some(text) = after.strip_prefix(b" ") {
                return Some((ts, text));
            }
        }
    }
    None
}

/// `path.n`: the n-th rotated copy (1 = newest).
fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{n}"));
    PathBuf::from(p)
}

/// The rotated copies that exist, newest first.
fn rotated_files(path: &Path) -> Vec<PathBuf> {
    (1..)
        .map(|n| rotated(path, n))
        .take_while(|p| p.exists())
        .collect()
}

/// The complete records in `file[0..end)` (the part after the last newline is ignored), at
/// most the last `n`, oldest first. Reads backwards, so only what is needed.
fn last_records(file: &mut File, end: u64, n: usize) -> io::Result<Vec<Vec<u8>>> {
    if n == 0 || end == 0 {
        return Ok(Vec::new());
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = end;
    // Enough newlines to hold n complete records, counting the one ending the region.
    while pos > 0 && buf.iter().filter(|b| **b == b'\n').count() <= n {
        let step = CHUNK.min(pos as usize);
        pos -= step as u64;
        let mut chunk = vec![0; step];
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
    }
    // Drop the incomplete tail (after the last newline)...
    let Some(last_nl) = buf.iter().rposition(|b| *b == b'\n') else {
        return Ok(Vec::new());
    };
    buf.truncate(last_nl);
    let mut parts: Vec<&[u8]> = buf.split(|b| *b == b'\n').collect();
    // ...and the incomplete head (a record that started before `pos`).
    if pos > 0 && !parts.is_empty() {
        parts.remove(0);
    }
    let skip = parts.len().saturating_sub(n);
    Ok(parts[skip..].iter().map(|p| p.to_vec()).collect())
}

/// Reads one container's log: first what is there (all of it, or the tail), then, polled,
/// whatever is appended.
pub struct LogReader {
    path: PathBuf,
    formatter: LineFormatter,
    /// The current file as opened, and where reading it continues.
    current: Option<File>,
}

impl LogReader {
    pub fn new(path: PathBuf, timestamps: bool) -> Self {
        LogReader {
            path,
            formatter: LineFormatter::new(timestamps),
            current: None,
        }
    }

    /// Whether the container has written any log yet.
    pub fn exists(&self) -> bool {
        self.path.exists() || rotated(&self.path, 1).exists()
    }

    /// The last `tail` lines across the rotated files (all lines when `None`), formatted, in
    /// chunks of about [`CHUNK`] bytes passed to `emit`; `emit` returning false stops early.
    /// Afterwards [`LogReader::poll`] continues where this ended.
    pub fn initial(
        &mut self,
        tail: Option<usize>,
        mut emit: impl FnMut(Vec<u8>) -> bool,
    ) -> io::Result<()> {
        // Open the current file first: what it holds now is the boundary between the
        // snapshot and the follow.
        let mut current = match File::open(&self.path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let end = match &current {
            Some(f) => f.metadata()?.len(),
            None => 0,
        };
        let rotated = rotated_files(&self.path);
        match tail {
            Some(n) => {
                // Newest file first, until n records are found.
                let mut groups: VecDeque<Vec<Vec<u8>>> = VecDeque::new();
                let mut need = n;
                if let Some(f) = current.as_mut() {
                    let recs = last_records(f, end, need)?;
                    need -= recs.len();
                    groups.push_front(recs);
                }
                for p in &rotated {
                    if need == 0 {
                        break;
                    }
                    let mut f = match File::open(p) {
                        Ok(f) => f,
                        // Rotated away meanwhile.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                        Err(e) => return Err(e),
                    };
                    let len = f.metadata()?.len();
                    let recs = last_records(&mut f, len, need)?;
                    need -= recs.len();
                    groups.push_front(recs);
                }
                let mut out = Vec::new();
                for rec in groups.iter().flatten() {
                    self.formatter.record(rec, &mut out);
                    if out.len() >= CHUNK && !emit(std::mem::take(&mut out)) {
                        return Ok(());
                    }
                }
                if !out.is_empty() && !emit(out) {
                    return Ok(());
                }
                // Continue after the last complete record of the current file.
                if let Some(f) = current.as_mut() {
                    let mut tail_buf = Vec::new();
                    let start = partial_start(f, end)?;
                    f.seek(SeekFrom::Start(start))?;
                    f.by_ref().take(end - start).read_to_end(&mut tail_buf)?;
                    self.formatter.pending = tail_buf;
                }
            }
            None => {
                for p in rotated.iter().rev() {
                    match File::open(p) {
                        Ok(mut f) => {
                            if !self.copy(&mut f, u64::MAX, &mut emit)? {
                                return Ok(());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                    // A rotated file ends with a complete record; drop any stray partial.
                    self.formatter.pending.clear();
                }
                if let Some(f) = current.as_mut()
                    && !self.copy(f, end, &mut emit)?
                {
                    return Ok(());
                }
            }
        }
        if let Some(f) = current.as_mut() {
            f.seek(SeekFrom::Start(end))?;
        }
        self.current = current;
        Ok(())
    }

    /// Reads what was appended since the last call (following a rotation to the new file)
    /// and passes it, formatted, to `emit`. Returns false if `emit` did.
    pub fn poll(&mut self, mut emit: impl FnMut(Vec<u8>) -> bool) -> io::Result<bool> {
        let Some(mut f) = self.current.take() else {
            match File::open(&self.path) {
                Ok(f) => self.current = Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
                Err(e) => return Err(e),
            }
            return self.poll(emit);
        };
        if !self.copy(&mut f, u64::MAX, &mut emit)? {
            return Ok(false);
        }
        let rotated = match std::fs::metadata(&self.path) {
            Ok(m) => m.ino() != f.metadata()?.ino(),
            // Rotation in progress (renamed, new file not created yet): look again later.
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if rotated {
            // The shim finished the old file before creating the new one; read its very end
            // (written between our read and the rename), then switch.
            if !self.copy(&mut f, u64::MAX, &mut emit)? {
                return Ok(false);
            }
            self.formatter.pending.clear();
            match File::open(&self.path) {
                Ok(new) => self.current = Some(new),
                // Rotated again already: the next poll opens whatever is there then.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
                Err(e) => return Err(e),
            }
            return self.poll(emit);
        }
        self.current = Some(f);
        Ok(true)
    }

    /// Formats `f` from its position up to `limit` bytes more; false if `emit` said stop.
    fn copy(
        &mut self,
        f: &mut File,
        limit: u64,
        emit: &mut impl FnMut(Vec<u8>) -> bool,
    ) -> io::Result<bool> {
        let mut left = limit;
        let mut buf = vec![0; CHUNK];
        while left > 0 {
            let want = CHUNK.min(usize::try_from(left).unwrap_or(CHUNK));
            let n = f.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            left -= n as u64;
            let mut out = Vec::new();
            self.formatter.feed(&buf[..n], &mut out);
            if !out.is_empty() && !emit(out) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Offset just after the last newline in `f[0..end)` (0 if none).
fn partial_start(f: &mut File, end: u64) -> io::Result<u64> {
    let mut pos = end;
    let mut buf = vec![0; CHUNK];
    while pos > 0 {
        let step = CHUNK.min(pos as usize);
        pos -= step as u64;
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut buf[..step])?;
        if let Some(i) = buf[..step].iter().rposition(|b| *b == b'\n') {
            return Ok(pos + i as u64 + 1);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn rec(i: usize) -> String {
        let stream = if i.is_multiple_of(3) {
            "stderr"
        } else {
            "stdout"
        };
        format!("2026-11-22T05:00:{:02}.123Z {stream} line {i}\n", i % 60)
    }

    /// Writes records `range` split over rotated files: `sizes` records per file, oldest
    /// file first; the last entry is the current file.
    fn write_logs(dir: &Path, sizes: &[usize]) -> PathBuf {
        let path = dir.join("container.log");
        let mut i = 0;
        let files = sizes.len();
        for (k, n) in sizes.iter().enumerate() {
            let p = if k + 1 == files {
                path.clone()
            } else {
                rotated(&path, files - 1 - k)
            };
            let mut f = File::create(p).unwrap();
            for _ in 0..*n {
                f.write_all(rec(i).as_bytes()).unwrap();
                i += 1;
            }
        }
        path
    }

    fn collect(r: &mut LogReader, tail: Option<usize>) -> String {
        let mut out = Vec::new();
        r.initial(tail, |c| {
            out.extend(c);
            true
        })
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    fn poll(r: &mut LogReader) -> String {
        let mut out = Vec::new();
        assert!(
            r.poll(|c| {
                out.extend(c);
                true
            })
            .unwrap()
        );
        String::from_utf8(out).unwrap()
    }

    fn lines(range: std::ops::Range<usize>) -> String {
        range.map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn strips_time_and_stream_or_keeps_the_time() {
        let f = LineFormatter::new(false);
        let mut out = Vec::new();
        f.record(b"2026-11-22T05:00:00.123Z stdout hello world", &mut out);
        f.record(b"2026-11-22T05:00:00.123Z stderr ", &mut out);
        f.record(b"2026-11-22T05:00:00.123Z stderr", &mut out);
        f.record(b"not a record", &mut out);
        assert_eq!(out, b"hello world\n\n\nnot a record\n");
        let f = LineFormatter::new(true);
        let mut out = Vec::new();
        f.record(b"2026-11-22T05:00:00.123Z stdout hi", &mut out);
        assert_eq!(out, b"2026-11-22T05:00:00.123Z hi\n");
    }

    #[test]
    fn feed_holds_partial_records() {
        let mut f = LineFormatter::new(false);
        let mut out = Vec::new();
        f.feed(b"1 stdout a\n1 std", &mut out);
        assert_eq!(out, b"a\n");
        f.feed(b"err b\n", &mut out);
        assert_eq!(out, b"a\nb\n");
    }

    #[test]
    fn all_lines_across_rotated_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_logs(dir.path(), &[3, 4, 5]);
        let mut r = LogReader::new(path, false);
        assert_eq!(collect(&mut r, None), lines(0..12));
    }

    #[test]
    fn tail_spans_rotated_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_logs(dir.path(), &[3, 4, 5]);
        for (n, want) in [
            (0, lines(0..0)),
            (2, lines(10..12)),
            (5, lines(7..12)),
            (7, lines(5..12)),
            (100, lines(0..12)),
        ] {
            let mut r = LogReader::new(path.clone(), false);
            assert_eq!(collect(&mut r, Some(n)), want, "tail {n}");
        }
    }

    #[test]
    fn tail_of_a_big_file_reads_backwards_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_logs(dir.path(), &[5000]);
        let mut r = LogReader::new(path, false);
        assert_eq!(collect(&mut r, Some(3000)), lines(2000..5000));
    }

    #[test]
    fn follow_sees_appends_partial_lines_and_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_logs(dir.path(), &[2]);
        let mut r = LogReader::new(path.clone(), false);
        assert_eq!(collect(&mut r, Some(1)), lines(1..2));
        assert_eq!(poll(&mut r), "");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(rec(2).as_bytes()).unwrap();
        f.write_all(b"2026-11-22T05:00:03.000Z stdout par").unwrap();
        assert_eq!(poll(&mut r), lines(2..3));
        f.write_all(b"tial\n").unwrap();
        assert_eq!(poll(&mut r), "partial\n");
        // Rotation the way the shim does it: a last record, rename, new file.
        f.write_all(rec(4).as_bytes()).unwrap();
        drop(f);
        std::fs::rename(&path, rotated(&path, 1)).unwrap();
        let mut f = File::create(&path).unwrap();
        f.write_all(rec(5).as_bytes()).unwrap();
        assert_eq!(poll(&mut r), lines(4..6));
        assert_eq!(poll(&mut r), "");
    }

    #[test]
    fn tail_keeps_an_unfinished_last_record_for_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_logs(dir.path(), &[2]);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"2026-11-22T05:00:03.000Z stdout unfin")
            .unwrap();
        let mut r = LogReader::new(path.clone(), false);
        assert_eq!(collect(&mut r, Some(5)), lines(0..2));
        f.write_all(b"ished\n").unwrap();
        assert_eq!(poll(&mut r), "unfinished\n");
    }

    #[test]
    fn missing_log_is_empty_until_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("container.log");
        let mut r = LogReader::new(path.clone(), true);
        assert!(!r.exists());
        assert_eq!(collect(&mut r, None), "");
        assert_eq!(poll(&mut r), "");
        std::fs::write(&path, "2026-11-22T05:00:00.000Z stdout up\n").unwrap();
        assert_eq!(poll(&mut r), "2026-11-22T05:00:00.000Z up\n");
    }
}
