//! `aya::Pod` for the LB's and NetworkPolicy enforcement's map types. They are defined in the `no_std` shared crate, which does
//! not depend on aya, so aya sees them through the transparent wrapper [`P`].

use skiff_common::l2::L2Announce;
use skiff_common::lb::{
    LbAffinity, LbAffinityKey, LbBackend, LbCounters, LbMaglev, LbRevNat, LbRevNatKey, LbService,
    LbServiceKey, LbSlotKey, NpCtEntry, NpCtKey,
};
use skiff_common::podnet::{FastPathCounters, PodEndpoint, PodEndpointKey};
use skiff_common::policy::{
    PolCounterKey, PolCounters, PolCtEntry, PolCtKey, PolEndpoint, PolHostPort, PolHostPortKey,
    PolRuleKey,
};

/// A map key or value as aya reads and writes it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct P<T>(pub T);

macro_rules! pod {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: the type is `#[repr(C)]`, made of integers and byte arrays with explicit
            // padding fields (no implicit holes, checked by skiff-common's layout test), so
            // every bit pattern is a valid value; `P` is a transparent wrapper around it.
            unsafe impl aya::Pod for P<$t> {}
        )*
    };
}

pod!(
    LbServiceKey,
    LbService,
    LbSlotKey,
    LbBackend,
    LbCounters,
    LbRevNatKey,
    LbRevNat,
    LbAffinityKey,
    LbAffinity,
    NpCtKey,
    NpCtEntry,
    LbMaglev,
    PodEndpointKey,
    PodEndpoint,
    PolEndpoint,
    PolRuleKey,
    PolCtKey,
    PolCtEntry,
    PolHostPortKey,
    PolHostPort,
    PolCounterKey,
    PolCounters,
    FastPathCounters,
    L2Announce,
);
