//! Taints and tolerations: the one implementation of Kubernetes' matching rules, used by the
//! scheduler (which nodes a pod may go to) and the node lifecycle controller (which pods must
//! leave a node, and when).

use crate::api::{Taint, Toleration};

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// The taint Kubernetes puts on cordoned nodes; pods tolerating it may go there.
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// The taint on nodes whose `Ready` condition is `False`.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The taint on nodes whose `Ready` condition is `Unknown` (the agent stopped reporting).
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// Whether `toleration` tolerates `taint` (Kubernetes' `ToleratesTaint`): the effect matches
/// (an empty one matches all), the key matches (an empty key with `Exists` matches all), and
/// for `Equal` (the default operator) the value matches.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if !toleration.effect.is_empty() && toleration.effect != taint.effect {
        return false;
    }
    if !toleration.key.is_empty() && toleration.key != taint.key {
        return false;
    }
    match toleration.operator.as_str() {
        "Exists" => true,
        "" | "Equal" => toleration.key == taint.key && toleration.value == taint.value,
        _ => false,
    }
}

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// Whether `tolerations` tolerate a `NoSchedule` taint with `key` and no value.
pub fn tolerates_key(tolerations: &[Toleration], key: &str) -> bool {
    let taint = Taint {
        key: key.to_string(),
        effect: NO_SCHEDULE.to_string(),
        ..Default::default()
    };
    tolerated(tolerations, &taint)
}

/// The first of `taints` whose effect `effect` accepts and that no toleration tolerates.
pub fn find_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effect: impl Fn(&str) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|t| effect(&t.effect) && !tolerated(tolerations, t))
}

/// How long a pod tolerates a `NoExecute` taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tolerance {
    /// No toleration matches: the pod is evicted at once.
    None,
    /// For this many seconds after the taint was added.
    Seconds(u64),
    /// As long as the taint stays.
    Forever,
}

/// How long `tolerations` tolerate `taint`: the smallest `tolerationSeconds` among the
/// tolerations that match it (a negative one counts as 0; a matching toleration without it
/// tolerates forever unless another matching one is bounded), as Kubernetes'
/// `getMinTolerationTime`.
pub fn tolerance(tolerations: &[Toleration], taint: &Taint) -> Tolerance {
    let mut out = Tolerance::None;
    for t in tolerations.iter().filter(|t| tolerates(t, taint)) {
        let this = match t.toleration_seconds {
            Some(s) => Tolerance::Seconds(u64::try_from(s).unwrap_or(0)),
            None => Tolerance::Forever,
        };
        out = match out {
            Tolerance::None => this,
            seen => seen.min(this),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn tol(key: &str, op: &str, value: &str, effect: &str) -> Toleration {
        Toleration {
            key: key.into(),
            operator: op.into(),
            value: value.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn for_secs(mut t: Toleration, s: i64) -> Toleration {
        t.toleration_seconds = Some(s);
        t
    }

    #[test]
    fn tolerations() {
        let t = taint("dedicated", "gpu", NO_SCHEDULE);
        assert!(tolerates(
            &tol("dedicated", "Equal", "gpu", NO_SCHEDULE),
            &t
        ));
        assert!(tolerates(&tol("dedicated", "", "gpu", ""), &t));
        assert!(tolerates(&tol("dedicated", "Exists", "", ""), &t));
        assert!(tolerates(&tol("", "Exists", "", ""), &t), "tolerates all");
        assert!(!tolerates(&tol("", "Equal", "", ""), &t));
        assert!(!tolerates(&tol("dedicated", "Equal", "cpu", ""), &t));
        assert!(!tolerates(&tol("dedicated", "Exists", "", NO_EXECUTE), &t));
        assert!(!tolerates(&tol("other", "Exists", "", ""), &t));
        assert!(tolerates_key(
            &[tol(TAINT_UNSCHEDULABLE, "Exists", "", NO_SCHEDULE)],
            TAINT_UNSCHEDULABLE
        ));
    }

    #[test]
    fn untolerated_taints_by_effect() {
        let taints = [
            taint("a", "", PREFER_NO_SCHEDULE),
            taint("b", "", NO_SCHEDULE),
            taint("c", "", NO_EXECUTE),
        ];
        let tols = [tol("b", "Exists", "", "")];
        let hard = |e: &str| e == NO_SCHEDULE || e == NO_EXECUTE;
        assert_eq!(
            find_untolerated(&taints, &tols, hard).map(|t| t.key.as_str()),
            Some("c")
        );
        assert_eq!(find_untolerated(&taints, &tols, |e| e == NO_SCHEDULE), None);
        assert_eq!(
            find_untolerated(&taints, &[], |e| e == NO_EXECUTE).map(|t| t.key.as_str()),
            Some("c")
        );
    }

    #[test]
    fn tolerance_is_the_smallest_matching_bound() {
        let t = taint(TAINT_UNREACHABLE, "", NO_EXECUTE);
        assert_eq!(tolerance(&[], &t), Tolerance::None);
        assert_eq!(
            tolerance(&[tol(TAINT_NOT_READY, "Exists", "", NO_EXECUTE)], &t),
            Tolerance::None
        );
        assert_eq!(
            tolerance(&[tol(TAINT_UNREACHABLE, "Exists", "", NO_EXECUTE)], &t),
            Tolerance::Forever
        );
        let bounded = for_secs(tol(TAINT_UNREACHABLE, "Exists", "", NO_EXECUTE), 300);
        assert_eq!(
            tolerance(std::slice::from_ref(&bounded), &t),
            Tolerance::Seconds(300)
        );
        // A bounded toleration wins over an unbounded one; the smallest bound wins.
        assert_eq!(
            tolerance(
                &[
                    tol("", "Exists", "", ""),
                    bounded,
                    for_secs(tol(TAINT_UNREACHABLE, "", "", ""), 30),
                ],
                &t
            ),
            Tolerance::Seconds(30)
        );
        // A negative bound is zero; a toleration for another effect does not count.
        assert_eq!(
            tolerance(
                &[for_secs(
                    tol(TAINT_UNREACHABLE, "Exists", "", NO_EXECUTE),
                    -5
                )],
                &t
            ),
            Tolerance::Seconds(0)
        );
        assert_eq!(
            tolerance(
                &[for_secs(
                    tol(TAINT_UNREACHABLE, "Exists", "", NO_SCHEDULE),
                    5
                )],
                &t
            ),
            Tolerance::None
        );
    }
}
