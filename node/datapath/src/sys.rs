//! The two `bpf(2)` commands aya 0.14 does not expose for cgroup links: reading a link's
//! cgroup and attach type (`BPF_OBJ_GET_INFO_BY_FD`), and replacing the program of a link in
//! place (`BPF_LINK_UPDATE`), plus opening a pinned link (`BPF_OBJ_GET`; aya's `PinnedLink`
//! does not lend its descriptor). Used to take over the pinned links of an earlier agent.
//!
//! And creating and pinning a cgroup link (`BPF_LINK_CREATE`, `BPF_OBJ_PIN`) for the
//! `cgroup_device` program, whose aya link cannot be turned into a pinnable `FdLink`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// `enum bpf_cmd` values (include/uapi/linux/bpf.h).
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// `enum bpf_attach_type` values of the cgroup socket-address hooks.
pub const BPF_CGROUP_INET_INGRESS: u32 = 0;
pub const BPF_CGROUP_INET_EGRESS: u32 = 1;
pub const BPF_CGROUP_INET4_CONNECT: u32 = 10;
pub const BPF_CGROUP_UDP4_SENDMSG: u32 = 14;
pub const BPF_CGROUP_UDP4_RECVMSG: u32 = 19;
pub const BPF_CGROUP_INET4_GETPEERNAME: u32 = 29;
pub const BPF_CGROUP_INET6_CONNECT: u32 = 11;
pub const BPF_CGROUP_UDP6_SENDMSG: u32 = 15;
pub const BPF_CGROUP_UDP6_RECVMSG: u32 = 20;
pub const BPF_CGROUP_INET6_GETPEERNAME: u32 = 30;
/// `enum bpf_attach_type` of the device cgroup hook.
pub const BPF_CGROUP_DEVICE: u32 = 6;

/// `BPF_LINK_TYPE_CGROUP`.
const BPF_LINK_TYPE_CGROUP: u32 = 3;
/// `BPF_LINK_TYPE_TCX`.
const BPF_LINK_TYPE_TCX: u32 = 11;
/// `enum bpf_attach_type` of TCX ingress.
pub const BPF_TCX_INGRESS: u32 = 46;

/// The `BPF_OBJ_*` member of `union bpf_attr` (up to `file_flags`).
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The `info` member of `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoByFdAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of the `link_create` member of `union bpf_attr` (no target-specific part).
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
}

/// The `link_update` member of `union bpf_attr`.
#[repr(C)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// The head of `struct bpf_link_info` up to the cgroup member of its union.
#[repr(C)]
#[derive(Default)]
struct LinkInfoHead {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    cgroup_id: u64,
    attach_type: u32,
    _pad2: u32,
}

/// What the kernel says about a cgroup link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLinkInfo {
    pub link_id: u32,
    pub prog_id: u32,
    /// 0 once the cgroup is gone (the kernel then detached the program).
    pub cgroup_id: u64,
    pub attach_type: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` points to a `#[repr(C)]` value laid out as the member of `union bpf_attr`
    // that `cmd` reads, and `size_of::<T>()` is its size; the kernel copies that many bytes in
    // (and zero-extends the rest) and writes only through pointers inside it that we set.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Opens the BPF object (here: a link) pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjGetAttr {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: BPF_OBJ_GET succeeded and returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins the BPF object `fd` (here: a link) at `path` on a BPF filesystem.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjGetAttr {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: fd_u32(fd)?,
        file_flags: 0,
    };
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Attaches program `prog` to the cgroup `cgroup` (an open cgroup v2 directory) at hook
/// `attach_type` with a new BPF link, returned. Cgroup links always coexist with the other
/// programs on the cgroup and its ancestors (multi-attach), so no flags.
pub fn cgroup_link_create(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: fd_u32(prog)?,
        target_fd: fd_u32(cgroup)?,
        attach_type,
        flags: 0,
    };
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: BPF_LINK_CREATE succeeded and returned a new file descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The cgroup and attach type of the cgroup link `link`. Fails with `InvalidData` for a link
/// of another type.
pub fn cgroup_link_info(link: BorrowedFd<'_>) -> io::Result<CgroupLinkInfo> {
    let mut info = LinkInfoHead::default();
    let mut attr = InfoByFdAttr {
        bpf_fd: fd_u32(link)?,
        info_len: std::mem::size_of::<LinkInfoHead>() as u32,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    if info.link_type != BPF_LINK_TYPE_CGROUP {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "link {} is of type {}, not a cgroup link",
                info.id, info.link_type
            ),
        ));
    }
    Ok(CgroupLinkInfo {
        link_id: info.id,
        prog_id: info.prog_id,
        cgroup_id: info.cgroup_id,
        attach_type: info.attach_type,
    })
}

/// The head of `struct bpf_link_info` up to the tcx member of its union.
#[repr(C)]
#[derive(Default)]
struct TcxLinkInfoHead {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    ifindex: u32,
    attach_type: u32,
}

/// What the kernel says about a TCX link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcxLinkInfo {
    /// 0 once the device is gone (the kernel then detached the program).
    pub ifindex: u32,
    pub attach_type: u32,
}

/// The device and attach type of the TCX link `link`. Fails with `InvalidData` for a link
/// of another type.
pub fn tcx_link_info(link: BorrowedFd<'_>) -> io::Result<TcxLinkInfo> {
    let mut info = TcxLinkInfoHead::default();
    let mut attr = InfoByFdAttr {
        bpf_fd: fd_u32(link)?,
        info_len: std::mem::size_of::<TcxLinkInfoHead>() as u32,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    if info.link_type != BPF_LINK_TYPE_TCX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "link {} is of type {}, not a tcx link",
                info.id, info.link_type
            ),
        ));
    }
    Ok(TcxLinkInfo {
        ifindex: info.ifindex,
        attach_type: info.attach_type,
    })
}

/// Replaces the program of `link` with `prog` atomically: the hook never runs without one.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: fd_u32(link)?,
        new_prog_fd: fd_u32(prog)?,
        flags: 0,
        old_prog_fd: 0,
    };
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

fn fd_u32(fd: BorrowedFd<'_>) -> io::Result<u32> {
    u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))
}
