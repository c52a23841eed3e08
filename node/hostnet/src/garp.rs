//! Gratuitous ARP from an `AF_PACKET` socket, and a device's ifindex and MAC: what a machine
//! that takes over an address sends so the segment's caches move to it at once (a node
//! announcing a LoadBalancer address, a control machine taking the API servers' virtual
//! address).
//!
//! Both act on the network namespace of the calling thread: call them inside the machine's
//! namespace ([`crate::run_in_netns_scoped`]). The frame is an ARP request with sender
//! and target address both the announced address (RFC 5227's announcement), broadcast.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

const ETH_P_ARP: u16 = 0x0806;
/// A gratuitous ARP frame: Ethernet header + ARP for IPv4 over Ethernet.
pub const GARP_LEN: usize = 42;

/// Device `ifname`'s ifindex and MAC.
pub fn link(ifname: &str) -> io::Result<(u32, [u8; 6])> {
    let sock = packet_socket()?;
    let mut req = ifreq(ifname)?;
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name; SIOCGIFINDEX writes only
    // `ifr_ifru.ifru_ifindex` inside it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFINDEX just set the union's ifindex member.
    let ifindex = unsafe { req.ifr_ifru.ifru_ifindex } as u32;
    // SAFETY: as above; SIOCGIFHWADDR writes only `ifr_ifru.ifru_hwaddr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR just set the union's hwaddr member.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (m, b) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *m = *b as u8;
    }
    Ok((ifindex, mac))
}

/// The gratuitous ARP frame announcing that `ip` is at `mac`.
pub fn frame(mac: [u8; 6], ip: Ipv4Addr) -> [u8; GARP_LEN] {
    let mut f = [0u8; GARP_LEN];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    // htype Ethernet, ptype IPv4, hlen 6, plen 4, oper request.
    f[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&ip.octets());
    // Target hardware address zero; target address the announced one.
    f[38..42].copy_from_slice(&ip.octets());
    f
}

/// Sends `count` gratuitous ARPs for `ip` at `mac` out of device `ifindex`, `gap` apart.
pub fn announce(
    ifindex: u32,
    mac: [u8; 6],
    ip: Ipv4Addr,
    count: u32,
    gap: std::time::Duration,
) -> io::Result<()> {
    let sock = packet_socket()?;
    let f = frame(mac, ip);
    // SAFETY: all-zero is a valid sockaddr_ll (plain integers and a byte array).
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_protocol = ETH_P_ARP.to_be();
    to.sll_ifindex = ifindex as i32;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(gap);
        }
        // SAFETY: `f` and `to` outlive the call and the lengths passed are theirs.
        let sent = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                f.as_ptr().cast(),
                f.len(),
                0,
                (&raw const to).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// An `AF_PACKET` raw socket that receives nothing (protocol 0): for sending and ioctls.
fn packet_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is checked and owned right after.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq(ifname: &str) -> io::Result<libc::ifreq> {
    // SAFETY: all-zero is a valid ifreq (integers, arrays and unions of them).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad device name {ifname:?}"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_is_an_arp_announcement() {
        let mac = [2, 0, 0, 0, 0, 9];
        let f = frame(mac, Ipv4Addr::new(192, 168, 100, 240));
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[6..12], &mac);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1], "request");
        assert_eq!(&f[22..28], &mac);
        assert_eq!(&f[28..32], &[192, 168, 100, 240]);
        assert_eq!(&f[32..38], &[0; 6]);
        assert_eq!(&f[38..42], &[192, 168, 100, 240]);
    }

    #[test]
    fn bad_names_are_refused() {
        assert!(ifreq("").is_err());
        assert!(ifreq("a-name-longer-than-ifnamsiz").is_err());
    }
}
