//! A netlink (rtnetlink) connection bound to one network namespace, and the few requests pod
//! networking needs, each turning failures into [`NetError::Netlink`] naming the operation.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::{RouteProtocol, RouteScope};
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};
use tokio::task::JoinHandle;

use super::NetError;
use super::netns::Netns;

const ENODEV: i32 = nix::libc::ENODEV;
const ESRCH: i32 = nix::libc::ESRCH;
const EADDRNOTAVAIL: i32 = nix::libc::EADDRNOTAVAIL;

/// The positive errno of a netlink error reply, if `e` is one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| c.get().abs()),
        _ => None,
    }
}

/// An rtnetlink connection whose socket lives in `netns`. The connection task is aborted when
/// this is dropped.
pub(crate) struct Rtnl {
    handle: Handle,
    task: JoinHandle<()>,
    netns: Netns,
}

impl Drop for Rtnl {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Rtnl {
    /// Opens the socket on a thread inside `netns` (a netlink socket stays bound to the
    /// namespace it was created in) and drives it on the runtime `rt`.
    pub(crate) async fn connect(
        netns: &Netns,
        rt: &tokio::runtime::Handle,
    ) -> Result<Self, NetError> {
        let rt_for_thread = rt.clone();
        let (conn, handle) = netns
            .run(move || {
                // The socket registers with the runtime's reactor when it is created.
                let _guard = rt_for_thread.enter();
                rtnetlink::new_connection().map(|(conn, handle, _messages)| (conn, handle))
            })
            .await?
            .map_err(|source| NetError::Netns {
                path: netns.display_path(),
                source,
            })?;
        let task = rt.spawn(conn);
        Ok(Self {
            handle,
            task,
            netns: netns.clone(),
        })
    }

    pub(crate) fn netns(&self) -> &Netns {
        &self.netns
    }

    fn fail(&self, op: impl std::fmt::Display) -> impl FnOnce(rtnetlink::Error) -> NetError {
        let op = format!("{op} in {}", self.netns);
        move |source| NetError::Netlink { op, source }
    }

    /// The link called `name`, if there is one.
    pub(crate) async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>, NetError> {
        let mut replies = self.handle.link().get().match_name(name).execute();
        match replies.try_next().await {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(self.fail(format_args!("get link {name}"))(e)),
        }
    }

    /// The link with index `index`, if there is one.
    pub(crate) async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>, NetError> {
        let mut replies = self.handle.link().get().match_index(index).execute();
        match replies.try_next().await {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(self.fail(format_args!("get link {index}"))(e)),
        }
    }

    /// Deletes link `index` (`name` is for messages). `Ok(false)` if it was already gone.
    pub(crate) async fn delete_link(&self, index: u32, name: &str) -> Result<bool, NetError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(false),
            Err(e) => Err(self
                .fail(format_args!("delete link {name} (index {index})"))(
                e
            )),
        }
    }

    /// Creates the veth pair `host` (here) <-> `peer` (directly inside the namespace
    /// `peer_netns`, so no half-configured peer ever shows up in this namespace).
    pub(crate) async fn create_veth(
        &self,
        host: &str,
        peer: &str,
        peer_netns: &Netns,
    ) -> Result<(), NetError> {
        let ns_file = peer_netns.open()?;
        let mut peer_msg = LinkUnspec::new_with_name(peer);
        if let Some(f) = &ns_file {
            // The kernel resolves the fd while handling the request in this process; `ns_file`
            // stays open until the request is answered.
            peer_msg = peer_msg.setns_by_fd(f.as_raw_fd());
        }
        let msg = LinkVeth::new(host, peer)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg.build())))
            .build();
        let result = self.handle.link().add(msg).execute().await;
        drop(ns_file);
        result.map_err(self.fail(format_args!(
            "create veth {host} with peer {peer} in {peer_netns}"
        )))
    }

    /// Brings link `index` up and, if given, sets its alias (`IFLA_IFALIAS`).
    pub(crate) async fn set_up(
        &self,
        index: u32,
        name: &str,
        alias: Option<&str>,
    ) -> Result<(), NetError> {
        let mut b = LinkUnspec::new_with_index(index).up();
        if let Some(alias) = alias {
            b = b.alias(alias);
        }
        self.handle
            .link()
            .change(b.build())
            .execute()
            .await
            .map_err(self.fail(format_args!("set link {name} up")))
    }

    /// `ip route replace <dst>/32 dev <index> scope link proto static`
    pub(crate) async fn replace_host_route(
        &self,
        dst: Ipv4Addr,
        index: u32,
        name: &str,
    ) -> Result<(), NetError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .protocol(RouteProtocol::Static)
            .build();
        self.replace_route(msg, format!("replace route {dst}/32 dev {name}"))
            .await
    }

    /// `ip route replace` of one built route message; `what` names it in errors.
    async fn replace_route(
        &self,
        msg: rtnetlink::packet_route::route::RouteMessage,
        what: String,
    ) -> Result<(), NetError> {
        let fail = self.fail(what);
        self.handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(fail)
    }

    /// Deletes the main-table route `<dst>/32` (any device). `Ok(false)` if there was none.
    pub(crate) async fn delete_host_route(&self, dst: Ipv4Addr) -> Result<bool, NetError> {
        self.delete_route(dst, 32).await
    }

    /// `ip route replace <dst>/<len> via <gw> proto static` (another node's pod CIDR through
    /// that node's address on the shared segment).
    pub(crate) async fn replace_route_via(
        &self,
        dst: Ipv4Addr,
        len: u8,
        gw: Ipv4Addr,
    ) -> Result<(), NetError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst, len)
            .gateway(gw)
            .protocol(RouteProtocol::Static)
            .build();
        self.replace_route(msg, format!("replace route {dst}/{len} via {gw}"))
            .await
    }

    /// Deletes the main-table route `<dst>/<len>`. `Ok(false)` if there was none.
    pub(crate) async fn delete_route(&self, dst: Ipv4Addr, len: u8) -> Result<bool, NetError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst, len)
            .scope(RouteScope::NoWhere)
            .protocol(RouteProtocol::Static)
            .build();
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(ESRCH) => Ok(false),
            Err(e) => Err(self.fail(format_args!("delete route {dst}/{len}"))(e)),
        }
    }

    /// `ip route replace default via <gw> dev <index> onlink`
    pub(crate) async fn replace_default_route_onlink(
        &self,
        gw: Ipv4Addr,
        index: u32,
        name: &str,
    ) -> Result<(), NetError> {
        let msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
            .gateway(gw)
            .output_interface(index)
            .onlink()
            .protocol(RouteProtocol::Static)
            .build();
        self.replace_route(msg, format!("replace default route via {gw} dev {name}"))
            .await
    }

    /// `ip neigh replace <ip> lladdr <mac> dev <index> nud permanent`
    pub(crate) async fn replace_permanent_neighbour(
        &self,
        ip: Ipv4Addr,
        mac: &[u8],
        index: u32,
        name: &str,
    ) -> Result<(), NetError> {
        self.handle
            .neighbours()
            .add(index, IpAddr::V4(ip))
            .link_layer_address(mac)
            .replace()
            .execute()
            .await
            .map_err(self.fail(format_args!("replace neighbour {ip} dev {name}")))
    }

    /// Makes `ip/prefix` the only IPv4 address of link `index`.
    pub(crate) async fn set_only_ipv4(
        &self,
        index: u32,
        name: &str,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), NetError> {
        for msg in self.addresses_of(index, name).await? {
            if msg.header.family != AddressFamily::Inet {
                continue;
            }
            if address_of(&msg) == Some(IpAddr::V4(ip)) && msg.header.prefix_len == prefix {
                continue;
            }
            self.delete_address(msg, name).await?;
        }
        self.add_address(index, name, ip, prefix).await
    }

    /// Adds (or replaces) `ip/prefix` on link `index` (`name`, for errors).
    async fn add_address(
        &self,
        index: u32,
        name: &str,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), NetError> {
        self.handle
            .address()
            .add(index, IpAddr::V4(ip), prefix)
            .replace()
            .execute()
            .await
            .map_err(self.fail(format_args!("add address {ip}/{prefix} to {name}")))
    }

    /// The addresses of link `index` (`name`, for errors).
    async fn addresses_of(&self, index: u32, name: &str) -> Result<Vec<AddressMessage>, NetError> {
        self.handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(self.fail(format_args!("list addresses of {name}")))
    }

    /// Deletes the address `msg` of link `name`; `Ok(false)` if it was gone already.
    async fn delete_address(&self, msg: AddressMessage, name: &str) -> Result<bool, NetError> {
        let addr = address_of(&msg);
        match self.handle.address().del(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(EADDRNOTAVAIL) => Ok(false),
            Err(e) => Err(self.fail(format_args!("delete address {addr:?} of {name}"))(e)),
        }
    }

    /// Adds `ip/prefix` to link `name` beside its other addresses (kept if already there).
    pub(crate) async fn add_ipv4(
        &self,
        name: &str,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), NetError> {
        let index = self.index_of(name).await?;
        self.add_address(index, name, ip, prefix).await
    }

    /// Removes `ip` from link `name`; `Ok(false)` if it did not hold it.
    pub(crate) async fn remove_ipv4(&self, name: &str, ip: Ipv4Addr) -> Result<bool, NetError> {
        let index = self.index_of(name).await?;
        let mut removed = false;
        for msg in self.addresses_of(index, name).await? {
            if address_of(&msg) == Some(IpAddr::V4(ip)) {
                removed |= self.delete_address(msg, name).await?;
            }
        }
        Ok(removed)
    }

    async fn index_of(&self, name: &str) -> Result<u32, NetError> {
        self.link_by_name(name)
            .await?
            .map(|l| l.header.index)
            .ok_or_else(|| NetError::Netlink {
                op: format!("find link {name} in {}", self.netns),
                source: rtnetlink::Error::RequestFailed,
            })
    }

    /// The first global (scope universe) IPv4 address in this namespace.
    pub(crate) async fn first_global_ipv4(&self) -> Result<Option<Ipv4Addr>, NetError> {
        Ok(self.first_global_ipv4_link().await?.map(|(ip, _)| ip))
    }

    /// [`Rtnl::first_global_ipv4`] and the index of the link that holds it.
    pub(crate) async fn first_global_ipv4_link(&self) -> Result<Option<(Ipv4Addr, u32)>, NetError> {
        let mut addrs = self.handle.address().get().execute();
        while let Some(msg) = addrs
            .try_next()
            .await
            .map_err(self.fail("dump addresses"))?
        {
            if msg.header.family != AddressFamily::Inet
                || msg.header.scope != AddressScope::Universe
            {
                continue;
            }
            if let Some(IpAddr::V4(v4)) = address_of(&msg)
                && !v4.is_loopback()
            {
                return Ok(Some((v4, msg.header.index)));
            }
        }
        Ok(None)
    }
}

/// The local address of an address message (`IFA_LOCAL`, else `IFA_ADDRESS`).
fn address_of(msg: &AddressMessage) -> Option<IpAddr> {
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    local.or_else(|| {
        msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        })
    })
}

/// The ifindex of a veth's peer (`IFLA_LINK`; an index in the peer's namespace).
pub(crate) fn peer_index(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(i) => Some(*i),
        _ => None,
    })
}

pub(crate) fn name(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(s) => Some(s.as_str()),
        _ => None,
    })
}

pub(crate) fn alias(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfAlias(s) => Some(s.as_str()),
        _ => None,
    })
}

pub(crate) fn mac(link: &LinkMessage) -> Option<&[u8]> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(m) => Some(m.as_slice()),
        _ => None,
    })
}
