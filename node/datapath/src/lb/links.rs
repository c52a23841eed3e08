//! The load balancer's links: the socket programs on the pods' cgroup parent, the NodePort
//! tc program on devices, both pinned and taken over by a restarted agent, and their removal.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use aya::programs::tc::TcAttachOptions;
use aya::programs::{
    CgroupAttachMode, CgroupSockAddr, LinkOrder, SchedClassifier, TcAttachType, links::FdLink,
};
use skiff_common::lb::{
    LB_CONNECT4_PROG, LB_CONNECT6_PROG, LB_GETPEERNAME4_PROG, LB_GETPEERNAME6_PROG,
    LB_RECVMSG4_PROG, LB_RECVMSG6_PROG, LB_SENDMSG4_PROG, LB_SENDMSG6_PROG, NP_INGRESS_PROG,
};

use super::bpf::{link_pin, pinned_cgroup_link, program, remove_file};
use super::{AttachReport, ServiceLb, TcAttach};
use crate::{BpfError, cgroup_id, is_cgroup2, sys};

/// One program and the hook it runs at.
pub(super) struct Hook {
    pub prog: &'static str,
    /// `enum bpf_attach_type`, to recognise an earlier agent's link.
    pub attach_type: u32,
}

/// Every socket-LB hook, IPv4 then IPv6; attach, takeover and detach all walk this list.
pub(super) const HOOKS: [Hook; 8] = [
    Hook {
        prog: LB_CONNECT4_PROG,
        attach_type: sys::BPF_CGROUP_INET4_CONNECT,
    },
    Hook {
        prog: LB_SENDMSG4_PROG,
        attach_type: sys::BPF_CGROUP_UDP4_SENDMSG,
    },
    Hook {
        prog: LB_RECVMSG4_PROG,
        attach_type: sys::BPF_CGROUP_UDP4_RECVMSG,
    },
    Hook {
        prog: LB_GETPEERNAME4_PROG,
        attach_type: sys::BPF_CGROUP_INET4_GETPEERNAME,
    },
    Hook {
        prog: LB_CONNECT6_PROG,
        attach_type: sys::BPF_CGROUP_INET6_CONNECT,
    },
    Hook {
        prog: LB_SENDMSG6_PROG,
        attach_type: sys::BPF_CGROUP_UDP6_SENDMSG,
    },
    Hook {
        prog: LB_RECVMSG6_PROG,
        attach_type: sys::BPF_CGROUP_UDP6_RECVMSG,
    },
    Hook {
        prog: LB_GETPEERNAME6_PROG,
        attach_type: sys::BPF_CGROUP_INET6_GETPEERNAME,
    },
];
/// Prefix of the pinned TCX links of the NodePort program (`link_np_<ifname>`).
const NP_LINK_PREFIX: &str = "link_np_";

/// Where the NodePort link of device `ifname` is pinned.
fn np_link_pin(pin_dir: &Path, ifname: &str) -> PathBuf {
    pin_dir.join(format!("{NP_LINK_PREFIX}{ifname}"))
}
impl ServiceLb {
    /// Attaches the eight socket programs to the cgroup v2 directory `cgroup_dir` (normally the node's
    /// pod cgroup parent; programs on an ancestor run for the sockets of every descendant)
    /// through pinned links, or takes over the links an earlier agent pinned for that cgroup
    /// (swapping in this agent's programs). Returns the cgroup id and what it did.
    pub fn attach(&mut self, cgroup_dir: &Path) -> Result<(u64, AttachReport), BpfError> {
        let id = cgroup_id(cgroup_dir)?;
        if !is_cgroup2(cgroup_dir).map_err(BpfError::io(cgroup_dir))? {
            return Err(BpfError::NotCgroup2(cgroup_dir.to_path_buf()));
        }
        let mut report = AttachReport::default();
        let dir = File::open(cgroup_dir).map_err(BpfError::io(cgroup_dir))?;
        for hook in &HOOKS {
            let pin = link_pin(&self.pin_dir, hook.prog);
            let prog = program::<CgroupSockAddr>(&mut self.ebpf, hook.prog)?;
            let outcome = pinned_cgroup_link(&pin, id, hook.attach_type, hook.prog, prog, |p| {
                // A link always coexists with other programs on the cgroup; explicit flags
                // are rejected for links, hence `Single` (no flags).
                let link_id = p.attach(&dir, CgroupAttachMode::Single)?;
                p.take_link(link_id)
            })?;
            match outcome {
                TcAttach::Attached => report.attached += 1,
                TcAttach::Adopted => report.adopted += 1,
                TcAttach::Replaced => {
                    report.replaced += 1;
                    report.attached += 1;
                }
            }
        }
        self.attached_to = Some(id);
        Ok((id, report))
    }

    /// Attaches the NodePort program as a TCX ingress link on device `ifname` of the calling
    /// thread's network namespace, pinned as `link_np_<ifname>`, or takes over the link an
    /// earlier agent pinned for that very device.
    pub fn attach_tc(&mut self, ifname: &str) -> Result<TcAttach, BpfError> {
        let ifindex = ifindex(ifname)?;
        let pin = np_link_pin(&self.pin_dir, ifname);
        let prog = program::<SchedClassifier>(&mut self.ebpf, NP_INGRESS_PROG)?;
        let mut outcome = TcAttach::Attached;
        match sys::obj_get(&pin) {
            Ok(link) => {
                let same = sys::tcx_link_info(std::os::fd::AsFd::as_fd(&link))
                    .map(|i| i.ifindex == ifindex && i.attach_type == sys::BPF_TCX_INGRESS)
                    .unwrap_or(false);
                if same {
                    let prog_fd = prog.fd().map_err(BpfError::program(NP_INGRESS_PROG))?;
                    sys::link_update(
                        std::os::fd::AsFd::as_fd(&link),
                        std::os::fd::AsFd::as_fd(prog_fd),
                    )
                    .map_err(BpfError::io(&pin))?;
                    return Ok(TcAttach::Adopted);
                }
                remove_file(&pin)?;
                drop(link);
                outcome = TcAttach::Replaced;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(BpfError::io(&pin)(e)),
        }
        let link_id = prog
            .attach_with_options(
                ifname,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(BpfError::program(NP_INGRESS_PROG))?;
        let link = prog
            .take_link(link_id)
            .map_err(BpfError::program(NP_INGRESS_PROG))?;
        let link = FdLink::try_from(link).map_err(|e| BpfError::Link {
            name: NP_INGRESS_PROG,
            source: Box::new(e),
        })?;
        link.pin(&pin).map_err(|e| BpfError::Pin {
            path: pin.clone(),
            source: Box::new(e),
        })?;
        Ok(outcome)
    }

    /// Detaches the NodePort program from device `ifname` (removes its link pin; the kernel
    /// already detached it if the device is gone). Missing pins are not an error.
    pub fn detach_tc(pin_dir: &Path, ifname: &str) -> Result<(), BpfError> {
        remove_file(&np_link_pin(pin_dir, ifname))
    }
    /// The id of the cgroup [`ServiceLb::attach`] attached to.
    pub fn attached_to(&self) -> Option<u64> {
        self.attached_to
    }
    /// Detaches programs an earlier agent left attached through links pinned in `pin_dir` (by
    /// removing those pins; maps stay). For an agent that does not run the load balancer
    /// (switched off, or it failed to load): nobody would keep those programs' maps current,
    /// and stale translations are worse than none. Missing pins are not an error.
    pub fn detach_pinned(pin_dir: &Path) -> Result<(), BpfError> {
        for hook in &HOOKS {
            remove_file(&link_pin(pin_dir, hook.prog))?;
        }
        let entries = match std::fs::read_dir(pin_dir) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(BpfError::io(pin_dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(BpfError::io(pin_dir))?;
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(NP_LINK_PREFIX))
            {
                remove_file(&entry.path())?;
            }
        }
        Ok(())
    }
}

/// The index of device `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> Result<u32, BpfError> {
    let c = std::ffi::CString::new(ifname).map_err(|e| {
        BpfError::io(Path::new(ifname))(io::Error::new(io::ErrorKind::InvalidInput, e))
    })?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(BpfError::io(Path::new(ifname))(io::Error::last_os_error()));
    }
    Ok(idx)
}
