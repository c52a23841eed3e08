//! What loading a BPF object takes, shared by the Service load balancer and NetworkPolicy
//! enforcement: its programs and maps by name, map helpers, pinned-map size checks and
//! pinned cgroup links that a restarted agent takes over.

use std::io;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::{HashMap, MapData, MapError, MapInfo, PerCpuHashMap};
use aya::programs::{CgroupSockAddr, Program, ProgramError, links::FdLink};

use super::TcAttach;
use crate::{BpfError, fs, sys};

/// Where the link of `prog` is pinned.
pub(crate) fn link_pin(pin_dir: &Path, prog: &str) -> PathBuf {
    pin_dir.join(format!("link_{prog}"))
}
/// A program whose link can be pinned and taken over: both cgroup program types.
pub(crate) trait LinkedProgram {
    type Link: TryInto<FdLink, Error = aya::programs::links::LinkError>;
    fn prog_fd(&self) -> Result<&aya::programs::ProgramFd, ProgramError>;
}

impl LinkedProgram for CgroupSockAddr {
    type Link = aya::programs::cgroup_sock_addr::CgroupSockAddrLink;
    fn prog_fd(&self) -> Result<&aya::programs::ProgramFd, ProgramError> {
        self.fd()
    }
}

impl LinkedProgram for aya::programs::CgroupSkb {
    type Link = aya::programs::cgroup_skb::CgroupSkbLink;
    fn prog_fd(&self) -> Result<&aya::programs::ProgramFd, ProgramError> {
        self.fd()
    }
}

/// Makes `prog` run on cgroup `cgroup_id` at hook `attach_type` through the link pinned at
/// `pin`: an earlier agent's link for that very cgroup and hook gets this program swapped in
/// (`BPF_LINK_UPDATE`, atomic); a pin for another (or a removed) cgroup is unpinned, which
/// detaches it, and a new link is made with `attach` and pinned.
pub(crate) fn pinned_cgroup_link<T: LinkedProgram>(
    pin: &Path,
    cgroup_id: u64,
    attach_type: u32,
    name: &'static str,
    prog: &mut T,
    attach: impl FnOnce(&mut T) -> Result<T::Link, ProgramError>,
) -> Result<TcAttach, BpfError> {
    let mut outcome = TcAttach::Attached;
    match sys::obj_get(pin) {
        Ok(link) => {
            let info = sys::cgroup_link_info(std::os::fd::AsFd::as_fd(&link))
                .map_err(BpfError::io(pin))?;
            if info.cgroup_id == cgroup_id && info.attach_type == attach_type {
                let prog_fd = prog.prog_fd().map_err(BpfError::program(name))?;
                sys::link_update(
                    std::os::fd::AsFd::as_fd(&link),
                    std::os::fd::AsFd::as_fd(prog_fd),
                )
                .map_err(BpfError::io(pin))?;
                return Ok(TcAttach::Adopted);
            }
            // Another cgroup (or one that is gone): this pin is the only reference besides
            // `link`, so removing it and closing `link` detaches it.
            remove_file(pin)?;
            drop(link);
            outcome = TcAttach::Replaced;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(BpfError::io(pin)(e)),
    }
    let link = attach(prog).map_err(BpfError::program(name))?;
    let link: FdLink = link.try_into().map_err(|e| BpfError::Link {
        name,
        source: Box::new(e),
    })?;
    link.pin(pin).map_err(|e| BpfError::Pin {
        path: pin.to_path_buf(),
        source: Box::new(e),
    })?;
    Ok(outcome)
}
pub(crate) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, BpfError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(BpfError::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(BpfError::program(name))
}

pub(crate) fn take_map<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> Result<M, MapError>,
) -> Result<M, BpfError> {
    let map = ebpf
        .take_map(name)
        .ok_or(BpfError::Missing { kind: "map", name })?;
    convert(map).map_err(BpfError::map(name))
}

pub(crate) fn max_entries(map: &MapData, name: &'static str) -> Result<u32, BpfError> {
    Ok(map.info().map_err(BpfError::map(name))?.max_entries())
}

pub(crate) fn entries<K: aya::Pod, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<Vec<(K, V)>, BpfError> {
    map.iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(BpfError::map(name))
}

pub(crate) fn keys<V: aya::Pod>(
    map: &PerCpuHashMap<MapData, u32, V>,
    name: &'static str,
) -> Result<Vec<u32>, BpfError> {
    map.keys()
        .collect::<Result<Vec<_>, _>>()
        .map_err(BpfError::map(name))
}

pub(crate) fn remove<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    name: &'static str,
    key: &K,
) -> Result<(), BpfError> {
    match map.remove(key) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BpfError::map(name)(e)),
    }
}
pub(crate) fn remove_file(path: &Path) -> Result<(), BpfError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BpfError::io(path)(e)),
    }
}
/// The maps `names` pinned in `pin_dir` must have the key and value sizes `expected` gives
/// (aya would reuse them blindly): an agent of another layout must not misread or corrupt
/// them.
pub(crate) fn check_pin_sizes(
    pin_dir: &Path,
    names: &[&'static str],
    expected: fn(&str) -> Option<(u32, u32)>,
) -> Result<(), BpfError> {
    for &name in names {
        let pin = fs::pin_path(pin_dir, name);
        if !pin.exists() {
            continue;
        }
        let info = MapInfo::from_pin(&pin).map_err(BpfError::map(name))?;
        let Some((key, value)) = expected(name) else {
            continue;
        };
        if info.key_size() != key || info.value_size() != value {
            return Err(BpfError::IncompatiblePin {
                path: pin,
                reason: format!(
                    "key/value sizes {}/{} where this agent uses {key}/{value}; remove the pins \
                     (skiff-node purge) to recreate the maps",
                    info.key_size(),
                    info.value_size()
                ),
            });
        }
    }
    Ok(())
}
