//! The volume writer (the kubelet's AtomicWriter) on arbitrary item paths, contents and
//! modes, in a volume directory that already holds a hostile tree (symlinks to a node
//! directory at `..data`, `..data_tmp`, the data directory, visible names and inside the
//! data directory, planted before and between writes): nothing outside the volume may
//! change, and after a write that succeeds the volume shows exactly its payload.
//!
//! Input: a flag byte (bit 0: an fsGroup), then records, each a tag byte:
//! * `0`: add an item: path (length byte, bytes), content (length byte, bytes), mode (2 bytes);
//! * `1`: write the items so far, then start an empty payload;
//! * `2`/`3`/`4`: plant a symlink / a directory / a file at a name (see [`name`]); a symlink
//!   points into the node directory the test watches (see [`target`]).
//!
//! Every symlink points into the watched `outside` directory, so a writer that followed one
//! could only damage that directory, never the machine.
#![no_main]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use skiff_runtime::volume::{FileProjection, Payload, writer};

/// `root/outside` (the node's files) and `root/vol` (the volume), made once per process.
struct Fixture {
    root: PathBuf,
    outside: PathBuf,
    vol: PathBuf,
    baseline: Tree,
    gid: u32,
}

/// Every entry below a directory: its type, mode, owner and content or link target.
type Tree = BTreeMap<PathBuf, String>;

const PREFIX: &str = "skiff-fuzz-volume_paths-";

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = std::env::temp_dir();
        // Directories of earlier runs whose process is gone.
        for e in fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(PREFIX)
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        let root = tmp.join(format!("{PREFIX}{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let outside = root.join("outside");
        fs::create_dir_all(outside.join("dir/sub")).expect("fixture");
        fs::write(outside.join("file"), "node file").expect("fixture");
        fs::write(outside.join("dir/inner"), "node inner").expect("fixture");
        std::os::unix::fs::symlink("file", outside.join("link")).expect("fixture");
        let gid = fs::metadata(&root).expect("fixture").gid();
        let baseline = snapshot(&outside);
        Fixture {
            vol: root.join("vol"),
            root,
            outside,
            baseline,
            gid,
        }
    })
}

fn snapshot(dir: &Path) -> Tree {
    let mut out = Tree::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d)
            .expect("listing the watched directory")
            .flatten()
        {
            let p = e.path();
            let m = fs::symlink_metadata(&p).expect("stat in the watched directory");
            let what = if m.file_type().is_symlink() {
                format!(
                    "l:{}",
                    fs::read_link(&p)
                        .map(|t| t.display().to_string())
                        .unwrap_or_default()
                )
            } else if m.is_dir() {
                todo.push(p.clone());
                "d".to_string()
            } else {
                format!("f:{:?}", fs::read(&p).ok())
            };
            let key = p.strip_prefix(dir).map(Path::to_path_buf).unwrap_or(p);
            out.insert(
                key,
                format!("{what} {:o} {}:{}", m.mode(), m.uid(), m.gid()),
            );
        }
    }
    out
}

/// Reads the input.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.byte()?).min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.byte()?, self.byte()?]))
    }
}

/// A name inside the volume to plant at: `..data`, `..data_tmp`, the data directory, a
/// visible name of an item, raw bytes, or an item's path inside the data directory; bit 7
/// appends a raw sub-path.
fn name(c: &mut Cur<'_>, vol: &Path, keys: &[Vec<u8>]) -> Option<Vec<u8>> {
    let k = c.byte()?;
    let ts = fs::read_link(vol.join("..data"))
        .map(|t| t.as_os_str().as_bytes().to_vec())
        .unwrap_or_else(|_| b"..2026_01_01_00_00_00.000000000".to_vec());
    let key = |c: &mut Cur<'_>| -> Option<Vec<u8>> {
        let i = usize::from(c.byte()?);
        keys.get(i % keys.len().max(1)).cloned()
    };
    let mut out = match k % 6 {
        0 => b"..data".to_vec(),
        1 => b"..data_tmp".to_vec(),
        2 => ts,
        3 => key(c)?
            .split(|b| *b == b'/')
            .find(|s| !s.is_empty() && *s != b".")
            .map(<[u8]>::to_vec)?,
        4 => c.bytes()?.to_vec(),
        _ => {
            let mut v = ts;
            v.push(b'/');
            v.extend(key(c)?);
            v
        }
    };
    if k & 0x80 != 0 {
        out.push(b'/');
        out.extend(c.bytes()?);
    }
    Some(out)
}

/// Where a planted symlink points: always into the watched directory.
fn target(c: &mut Cur<'_>, f: &Fixture) -> Option<PathBuf> {
    Some(match c.byte()? % 7 {
        0 => f.outside.clone(),
        1 => f.outside.join("dir"),
        2 => f.outside.join("file"),
        3 => PathBuf::from("../outside"),
        4 => PathBuf::from("../outside/dir"),
        5 => PathBuf::from("../../outside/dir"),
        _ => {
            let raw = c.bytes()?;
            let mut p = f.outside.clone();
            for s in raw.split(|b| *b == b'/') {
                if !s.is_empty() && s != b"." && s != b".." {
                    p.push(OsStr::from_bytes(s));
                }
            }
            p
        }
    })
}

enum Plant {
    Symlink(PathBuf),
    Dir,
    File,
}

/// Plants at `rel` below `vol`, replacing what is there. Its parents must be real
/// directories (checked without following a link): the harness itself never writes
/// through a symlink.
fn plant(vol: &Path, rel: &[u8], what: Plant) {
    let parts: Vec<&[u8]> = rel
        .split(|b| *b == b'/')
        .filter(|s| !s.is_empty() && *s != b"." && *s != b"..")
        .take(8)
        .collect();
    let Some((last, parents)) = parts.split_last() else {
        return;
    };
    let mut p = vol.to_path_buf();
    for s in parents {
        p.push(OsStr::from_bytes(s));
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if fs::create_dir(&p).is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
    p.push(OsStr::from_bytes(last));
    match fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => {
            let _ = fs::remove_dir_all(&p);
        }
        Ok(_) => {
            let _ = fs::remove_file(&p);
        }
        Err(_) => {}
    }
    let _ = match what {
        Plant::Symlink(t) => std::os::unix::fs::symlink(t, &p),
        Plant::Dir => fs::create_dir(&p),
        Plant::File => fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .map(drop),
    };
}

fn check_outside(f: &Fixture, when: &str) {
    let now = snapshot(&f.outside);
    assert_eq!(now, f.baseline, "the node directory changed ({when})");
    let mut names: Vec<_> = fs::read_dir(&f.root)
        .expect("listing the fixture")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["outside", "vol"],
        "something appeared next to the volume ({when})"
    );
}

fn write(f: &Fixture, payload: &Payload<'_>, fs_group: Option<u32>) {
    let r = writer::write_payload(&f.vol, payload, fs_group);
    check_outside(f, "after a write");
    if r.is_err() {
        return;
    }
    let vol = fs::canonicalize(&f.vol).expect("the volume");
    for (path, file) in payload {
        // The path as the writer reads it: empty and `.` components dropped.
        let mut p = f.vol.clone();
        for s in path.as_os_str().as_bytes().split(|b| *b == b'/') {
            if !s.is_empty() && s != b"." {
                p.push(OsStr::from_bytes(s));
            }
        }
        assert_eq!(
            fs::read(&p).ok().as_deref(),
            Some(&*file.data),
            "{path:?} after a successful write"
        );
        let real = fs::canonicalize(&p).expect("a written file");
        assert!(real.starts_with(&vol), "{path:?} resolves to {real:?}");
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let _ = fs::remove_dir_all(&f.vol);
    fs::create_dir(&f.vol).expect("the volume directory");
    let mut c = Cur(data);
    let fs_group = c.byte().and_then(|b| (b & 1 == 1).then_some(f.gid));
    let mut payload = Payload::new();
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut wrote = false;
    for _ in 0..64 {
        let Some(tag) = c.byte() else { break };
        match tag % 5 {
            0 => {
                let (Some(path), Some(content), Some(mode)) = (c.bytes(), c.bytes(), c.u16())
                else {
                    break;
                };
                keys.push(path.to_vec());
                payload.insert(
                    PathBuf::from(OsStr::from_bytes(path)),
                    FileProjection {
                        data: content.to_vec().into(),
                        mode: u32::from(mode),
                    },
                );
            }
            1 => {
                write(f, &payload, fs_group);
                payload = Payload::new();
                wrote = true;
            }
            kind => {
                let Some(at) = name(&mut c, &f.vol, &keys) else {
                    break;
                };
                let what = match kind {
                    2 => match target(&mut c, f) {
                        Some(t) => Plant::Symlink(t),
                        None => break,
                    },
                    3 => Plant::Dir,
                    _ => Plant::File,
                };
                plant(&f.vol, &at, what);
                check_outside(f, "after planting");
            }
        }
    }
    if !wrote || !payload.is_empty() {
        write(f, &payload, fs_group);
    }
});
