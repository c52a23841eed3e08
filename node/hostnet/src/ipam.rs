//! Host-local IPAM: pod addresses from the node's pod CIDR, one file per allocation.
//!
//! `<state_dir>/ipam/<ip>` holds the owning pod uid. A file is claimed with `link(2)` from a
//! fully written and synced temporary file: like `O_CREAT|O_EXCL` it fails with `EEXIST` if the
//! address is taken (so two allocators can never both win), and unlike a bare `O_EXCL` create a
//! crash can never leave an empty claim behind. An agent restarted on the same state directory
//! reloads every claim, so it never hands out an address that a live pod still holds.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tracing::{debug, info, warn};

use super::{NetError, PodCidr};

const TMP_PREFIX: &str = ".claim-";

pub(crate) struct Ipam {
    cidr: PodCidr,
    dir: PathBuf,
    tmp_seq: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_ip: BTreeMap<Ipv4Addr, String>,
    by_uid: HashMap<String, Ipv4Addr>,
    /// Where the next search starts, so that a just-released address is not reused at once.
    next: u32,
}

impl Inner {
    fn record(&mut self, ip: Ipv4Addr, uid: String) {
        match self.by_uid.get(&uid) {
            Some(existing) if *existing != ip => {
                warn!(%ip, %existing, pod_uid = %uid, "pod holds two addresses; keeping the first, the other stays reserved until the pod is released");
            }
            _ => {
                self.by_uid.insert(uid.clone(), ip);
            }
        }
        self.by_ip.insert(ip, uid);
    }
}

impl Ipam {
    /// Opens (creating if needed) `<state_dir>/ipam` and loads every claim in it.
    pub(crate) fn load(cidr: PodCidr, state_dir: &Path) -> Result<Self, NetError> {
        let dir = state_dir.join("ipam");
        let state_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| NetError::IpamState { path, source }
        };
        fs::create_dir_all(&dir).map_err(state_err(&dir))?;
        let mut claims = Vec::new();
        for entry in fs::read_dir(&dir).map_err(state_err(&dir))? {
            let entry = entry.map_err(state_err(&dir))?;
            let path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                warn!(path = %path.display(), "ignoring non-UTF-8 file in the IPAM directory");
                continue;
            };
            if name.starts_with(TMP_PREFIX) {
                // An unfinished claim of a previous run: it was never linked, so never handed out.
                debug!(path = %path.display(), "removing stale IPAM temporary file");
                if let Err(e) = fs::remove_file(&path) {
                    warn!(path = %path.display(), error = %e, "cannot remove stale IPAM temporary file");
                }
                continue;
            }
            let Ok(ip) = name.parse::<Ipv4Addr>() else {
                warn!(path = %path.display(), "ignoring file that is not named after an IPv4 address");
                continue;
            };
            let uid = fs::read_to_string(&path).map_err(state_err(&path))?;
            let uid = uid.trim().to_string();
            if uid.is_empty() {
                warn!(%ip, "IPAM claim without an owner; the address stays reserved");
            }
            if !cidr.contains(IpAddr::V4(ip)) {
                warn!(%ip, %cidr, pod_uid = %uid, "IPAM claim outside the pod CIDR (CIDR changed?); kept until released");
            }
            claims.push((ip, uid));
        }
        claims.sort();
        let mut inner = Inner::default();
        let range = cidr.pod_range_v4();
        inner.next = *range.start();
        for (ip, uid) in claims {
            let raw = u32::from(ip);
            if range.contains(&raw) && raw >= inner.next {
                inner.next = raw.saturating_add(1);
            }
            inner.record(ip, uid);
        }
        if !range.contains(&inner.next) {
            inner.next = *range.start();
        }
        info!(%cidr, dir = %dir.display(), allocated = inner.by_ip.len(), "IPAM state loaded");
        Ok(Self {
            cidr,
            dir,
            tmp_seq: AtomicU64::new(0),
            inner: Mutex::new(inner),
        })
    }

    pub(crate) fn cidr(&self) -> &PodCidr {
        &self.cidr
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The maps stay consistent even if a holder panicked: every update is a single insert or
        // remove after the file operation succeeded.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The address of `pod_uid`, allocating one if it has none. Idempotent.
    pub(crate) fn allocate(&self, pod_uid: &str) -> Result<Ipv4Addr, NetError> {
        let mut inner = self.lock();
        if let Some(ip) = inner.by_uid.get(pod_uid) {
            return Ok(*ip);
        }
        let range = self.cidr.pod_range_v4();
        let (start, end) = (*range.start(), *range.end());
        let mut candidate = if range.contains(&inner.next) {
            inner.next
        } else {
            start
        };
        // Bounded: every usable address is looked at once at most.
        for _ in 0..self.cidr.capacity() {
            let ip = Ipv4Addr::from(candidate);
            candidate = if candidate == end {
                start
            } else {
                candidate + 1
            };
            if inner.by_ip.contains_key(&ip) {
                continue;
            }
            match self.claim(ip, pod_uid)? {
                None => {
                    inner.record(ip, pod_uid.to_string());
                    inner.next = candidate;
                    info!(%ip, pod_uid, "allocated pod address");
                    return Ok(ip);
                }
                Some(owner) => {
                    // Claimed behind our back (another allocator on the same directory).
                    let mine = owner == pod_uid;
                    inner.record(ip, owner);
                    if mine {
                        return Ok(ip);
                    }
                }
            }
        }
        Err(NetError::Exhausted {
            cidr: self.cidr.to_string(),
        })
    }

    /// Claims `ip` for `pod_uid` on disk. `Ok(None)` on success, `Ok(Some(owner))` if the
    /// address was already claimed.
    fn claim(&self, ip: Ipv4Addr, pod_uid: &str) -> Result<Option<String>, NetError> {
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}{ip}-{}-{seq}", std::process::id()));
        let path = self.dir.join(ip.to_string());
        let write_tmp = || -> io::Result<()> {
            let mut f = File::options().write(true).create_new(true).open(&tmp)?;
            f.write_all(pod_uid.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()
        };
        if let Err(source) = write_tmp() {
            let _ = fs::remove_file(&tmp);
            return Err(NetError::IpamState { path: tmp, source });
        }
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                self.sync_dir()?;
                Ok(None)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let owner = fs::read_to_string(&path)
                    .map_err(|source| NetError::IpamState {
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string();
                Ok(Some(owner))
            }
            Err(source) => Err(NetError::IpamState { path, source }),
        }
    }

    fn sync_dir(&self) -> Result<(), NetError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| NetError::IpamState {
                path: self.dir.clone(),
                source,
            })
    }

    /// The address currently held by `pod_uid`, if any.
    pub(crate) fn lookup(&self, pod_uid: &str) -> Option<Ipv4Addr> {
        self.lock().by_uid.get(pod_uid).copied()
    }

    /// Releases every address held by `pod_uid`. Idempotent; returns what was released.
    pub(crate) fn release(&self, pod_uid: &str) -> Result<Vec<Ipv4Addr>, NetError> {
        let mut inner = self.lock();
        let owned: Vec<Ipv4Addr> = inner
            .by_ip
            .iter()
            .filter(|(_, uid)| uid.as_str() == pod_uid)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &owned {
            let path = self.dir.join(ip.to_string());
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(NetError::IpamState { path, source }),
            }
            inner.by_ip.remove(ip);
            info!(%ip, pod_uid, "released pod address");
        }
        inner.by_uid.remove(pod_uid);
        if !owned.is_empty() {
            self.sync_dir()?;
        }
        Ok(owned)
    }

    pub(crate) fn allocations(&self) -> Vec<(IpAddr, String)> {
        self.lock()
            .by_ip
            .iter()
            .map(|(ip, uid)| (IpAddr::V4(*ip), uid.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> PodCidr {
        PodCidr::parse(s).expect("valid CIDR")
    }

    #[test]
    fn allocates_idempotently_and_survives_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ipam = Ipam::load(cidr("10.244.7.0/24"), dir.path()).expect("load");
        let a = ipam.allocate("pod-a").expect("a");
        let b = ipam.allocate("pod-b").expect("b");
        assert_eq!(a, Ipv4Addr::new(10, 244, 7, 2));
        assert_eq!(b, Ipv4Addr::new(10, 244, 7, 3));
        assert_eq!(ipam.allocate("pod-a").expect("a again"), a);
        let on_disk = fs::read_to_string(dir.path().join("ipam/10.244.7.2")).expect("file");
        assert_eq!(on_disk.trim(), "pod-a");

        let reloaded = Ipam::load(cidr("10.244.7.0/24"), dir.path()).expect("reload");
        assert_eq!(reloaded.lookup("pod-a"), Some(a));
        assert_eq!(reloaded.allocate("pod-b").expect("b"), b);
        let c = reloaded.allocate("pod-c").expect("c");
        assert!(c != a && c != b);
        assert_eq!(reloaded.allocations().len(), 3);
    }

    #[test]
    fn release_frees_and_is_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ipam = Ipam::load(cidr("10.0.0.0/30"), dir.path()).expect("load");
        let a = ipam.allocate("a").expect("a");
        assert_eq!(a, Ipv4Addr::new(10, 0, 0, 2));
        assert!(matches!(
            ipam.allocate("b"),
            Err(NetError::Exhausted { .. })
        ));
        assert_eq!(ipam.release("a").expect("release"), vec![a]);
        assert!(ipam.release("a").expect("release again").is_empty());
        assert!(!dir.path().join("ipam/10.0.0.2").exists());
        assert_eq!(ipam.allocate("b").expect("b"), a);
    }

    #[test]
    fn claims_made_elsewhere_are_respected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ipam = Ipam::load(cidr("10.1.0.0/29"), dir.path()).expect("load");
        // Another allocator (or a file left by an older agent) claims .2 after we loaded.
        fs::write(dir.path().join("ipam/10.1.0.2"), "other\n").expect("write");
        fs::write(dir.path().join("ipam/.claim-10.1.0.3-1-0"), "junk").expect("write");
        assert_eq!(
            ipam.allocate("mine").expect("mine"),
            Ipv4Addr::new(10, 1, 0, 3)
        );
        assert!(
            ipam.allocations()
                .contains(&(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 2)), "other".into()))
        );
        let reloaded = Ipam::load(cidr("10.1.0.0/29"), dir.path()).expect("reload");
        assert!(!dir.path().join("ipam/.claim-10.1.0.3-1-0").exists());
        assert_eq!(reloaded.allocations().len(), 2);
    }
}
