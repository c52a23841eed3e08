//! `/proc/self/mountinfo`: the one parser of the mount table in Skiff (the cgroup v2 root and
//! bpffs in [`crate::host`], whether `/run/netns` is a mount point, tests that check nothing
//! is left mounted).

use std::path::PathBuf;

/// One mount of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted (octal escapes such as `\040` decoded).
    pub mount_point: PathBuf,
    /// The file system type, e.g. `cgroup2`, `bpf`, `overlay`.
    pub fstype: String,
    /// The mount source, e.g. `/dev/vda` or `cgroup2`.
    pub source: String,
}

/// The path of this process's mount table.
pub const PATH: &str = "/proc/self/mountinfo";

/// Parses the text of a mountinfo file; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// Reads and parses this process's mount table.
pub fn read() -> std::io::Result<Vec<MountEntry>> {
    std::fs::read_to_string(PATH).map(|t| parse(&t))
}

/// The mount points at or below `dir`, deepest first (the order to unmount them in).
pub fn under(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    let mut points: Vec<PathBuf> = read()?
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(points)
}

fn parse_line(line: &str) -> Option<MountEntry> {
    // id parent major:minor root mountpoint options [optional...] - fstype source superopts
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split_whitespace().nth(4)?;
    let mut right = right.split_whitespace();
    let fstype = right.next()?;
    let source = right.next().unwrap_or_default();
    Some(MountEntry {
        mount_point: PathBuf::from(unescape_octal(mount_point)),
        fstype: fstype.to_string(),
        source: unescape_octal(source),
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\NNN` octal.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_unescapes() {
        let text = "\
41 35 0:38 / /mnt/my\\040cg rw,relatime shared:9 - cgroup2 cgroup2 rw
50 24 0:45 / /sys/fs/bpf rw,relatime - bpf bpf rw
garbage line
";
        let m = parse(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/my cg"));
        assert_eq!(
            (m[0].fstype.as_str(), m[0].source.as_str()),
            ("cgroup2", "cgroup2")
        );
        assert_eq!(m[1].fstype, "bpf");
    }

    #[test]
    fn reads_this_process_table() {
        let mounts = read().expect("mountinfo");
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_point == std::path::Path::new("/"))
        );
    }
}
