//! PersistentVolumes, PersistentVolumeClaims and StorageClasses as served kinds, driven with
//! the real kubectl 1.32: a StorageClass marked default is given to a claim that names no
//! class (the DefaultStorageClass admission) but not to one that asks for none (`""`); a
//! hostPath volume made by hand reads back with Kubernetes' defaults; `kubectl get pv,pvc,sc`
//! prints kubectl's columns; invalid objects and a change of a class's provisioner are
//! refused with kube-apiserver's messages and field paths.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use skiff_tests::cluster::Cluster;

/// A class nothing provisions for (no volume appears behind the test's back), marked default.
const DEFAULT_CLASS: &str = r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: e2e-default
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: example.com/e2e
volumeBindingMode: WaitForFirstConsumer
"#;

const CLAIM: &str = r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
"#;

const NO_CLASS_CLAIM: &str = r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: no-class
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  resources:
    requests:
      storage: 1Gi
"#;

/// A volume of its own class, so that no claim of the test binds it.
const HOST_PATH_VOLUME: &str = r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: manual
spec:
  capacity:
    storage: 2Gi
  accessModes: [ReadOnlyMany, ReadWriteOnce]
  storageClassName: manual
  hostPath:
    path: /var/lib/skiff-e2e/manual
"#;

/// The lines of a `kubectl get` table, split into words.
fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_kinds_are_defaulted_validated_and_listed() {
    let c = Cluster::start(1).await;
    let k = |args: &[&str], stdin: Option<&str>| {
        let (ok, out, err) = c.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    };

    // The controller manager makes its own default class when it finds none at start; let
    // it come first, so that ours is the newest default (a tie goes to the first name,
    // ours too).
    for _ in 0..50 {
        if !k(&["get", "sc", "-o", "name"], None).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    k(&["apply", "-f", "-"], Some(DEFAULT_CLASS));
    k(&["apply", "-f", "-"], Some(CLAIM));
    k(&["apply", "-f", "-"], Some(NO_CLASS_CLAIM));
    k(&["apply", "-f", "-"], Some(HOST_PATH_VOLUME));

    // The DefaultStorageClass admission: the newest default class for a claim without one;
    // "" is a claim for volumes without a class and stays.
    let class = k(
        &[
            "get",
            "pvc",
            "claim",
            "-o",
            "jsonpath={.spec.storageClassName} {.spec.volumeMode} {.status.phase}",
        ],
        None,
    );
    assert_eq!(class, "e2e-default Filesystem Pending");
    let json = k(&["get", "pvc", "no-class", "-o", "json"], None);
    assert!(json.contains("\"storageClassName\": \"\""), "{json}");

    // Kubernetes' defaults for the class and the volume.
    assert_eq!(
        k(
            &[
                "get",
                "sc",
                "e2e-default",
                "-o",
                "jsonpath={.reclaimPolicy} {.volumeBindingMode}",
            ],
            None,
        ),
        "Delete WaitForFirstConsumer"
    );
    let pv = k(
        &[
            "get",
            "pv",
            "manual",
            "-o",
            "jsonpath={.spec.persistentVolumeReclaimPolicy} {.spec.volumeMode} \
             {.status.phase} {.status.lastPhaseTransitionTime}",
        ],
        None,
    );
    let pv: Vec<&str> = pv.split(' ').collect();
    assert_eq!(pv[..2], ["Retain", "Filesystem"], "{pv:?}");
    // Pending from creation; a volume controller may have found it Available since.
    assert!(["Pending", "Available"].contains(&pv[2]), "{pv:?}");
    assert!(pv[3].ends_with('Z'), "{pv:?}");

    // kubectl's columns for the three kinds, one table each.
    let tables = k(&["get", "pv,pvc,sc"], None);
    let lines = rows(&tables);
    let header = |first: &str| {
        lines
            .iter()
            .position(|l| l.first() == Some(&"NAME") && l.get(1) == Some(&first))
            .unwrap_or_else(|| panic!("no table with {first} in\n{tables}"))
    };
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.first() == Some(&name))
            .unwrap_or_else(|| panic!("no row {name} in\n{tables}"))
    };
    assert_eq!(
        lines[header("CAPACITY")],
        [
            "NAME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "RECLAIM",
            "POLICY",
            "STATUS",
            "CLAIM",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "REASON",
            "AGE"
        ],
        "{tables}"
    );
    // Unbound: no CLAIM, no REASON (blank cells).
    let manual = row("persistentvolume/manual");
    assert_eq!(manual[1..4], ["2Gi", "RWO,ROX", "Retain"], "{tables}");
    assert_eq!(manual[5..7], ["manual", "<unset>"], "{tables}");
    assert_eq!(
        lines[header("STATUS")],
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ],
        "{tables}"
    );
    // Pending: no VOLUME, CAPACITY or ACCESS MODES yet.
    assert_eq!(
        row("persistentvolumeclaim/claim")[1..4],
        ["Pending", "e2e-default", "<unset>"],
        "{tables}"
    );
    assert_eq!(
        lines[header("PROVISIONER")],
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ],
        "{tables}"
    );
    assert_eq!(
        row("storageclass.storage.k8s.io/e2e-default")[1..6],
        [
            "(default)",
            "example.com/e2e",
            "Delete",
            "WaitForFirstConsumer",
            "false"
        ],
        "{tables}"
    );

    // Refusals, with kube-apiserver's messages and the fields' paths.
    let refused = [
        (
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: no-storage}\n\
             spec: {accessModes: [ReadWriteOnce], resources: {requests: {}}}\n",
            "The PersistentVolumeClaim \"no-storage\" is invalid: spec.resources[storage]: \
             Required value",
        ),
        (
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: zero}\n\
             spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: \"0\"}}}\n",
            "The PersistentVolumeClaim \"zero\" is invalid: spec.resources[storage]: Invalid \
             value: \"0\": must be greater than zero",
        ),
        (
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: no-source}\n\
             spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce]}\n",
            "The PersistentVolume \"no-source\" is invalid: spec: Required value: must \
             specify a volume type",
        ),
        (
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: local-no-affinity}\n\
             spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], \
             local: {path: /mnt/disks/a}}\n",
            "The PersistentVolume \"local-no-affinity\" is invalid: spec.nodeAffinity: \
             Required value: Local volume requires node affinity",
        ),
        (
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: two-sources}\n\
             spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], \
             hostPath: {path: /a}, local: {path: /b}, nodeAffinity: {required: \
             {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, \
             operator: In, values: [n1]}]}]}}}\n",
            "The PersistentVolume \"two-sources\" is invalid: spec.local: Forbidden: may not \
             specify more than 1 volume type",
        ),
        (
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: sideways}\n\
             provisioner: example.com/e2e\nvolumeBindingMode: Sideways\n",
            "The StorageClass \"sideways\" is invalid: volumeBindingMode: Unsupported value: \
             \"Sideways\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
        ),
    ];
    for (manifest, message) in &refused {
        let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(manifest));
        assert!(!ok, "accepted:\n{manifest}");
        assert!(err.contains(message), "want {message:?}, got:\n{err}");
    }

    // A class's provisioner is fixed; what volumes were not made with may change.
    let (ok, _, err) = c.kubectl(
        &["apply", "-f", "-"],
        Some(&DEFAULT_CLASS.replace("example.com/e2e", "example.com/other")),
    );
    assert!(!ok, "the provisioner changed");
    assert!(
        err.contains(
            "The StorageClass \"e2e-default\" is invalid: provisioner: Forbidden: updates to \
             provisioner are forbidden."
        ),
        "{err}"
    );
    k(
        &[
            "patch",
            "sc",
            "e2e-default",
            "-p",
            r#"{"allowVolumeExpansion": true}"#,
        ],
        None,
    );
    // A pending claim's spec is fixed.
    let (ok, _, err) = c.kubectl(
        &[
            "patch",
            "pvc",
            "claim",
            "-p",
            r#"{"spec": {"resources": {"requests": {"storage": "2Gi"}}}}"#,
        ],
        None,
    );
    assert!(!ok, "a pending claim grew");
    assert!(
        err.contains(
            "The PersistentVolumeClaim \"claim\" is invalid: spec: Forbidden: spec is \
             immutable after creation except resources.requests and \
             volumeAttributesClassName for bound claims"
        ),
        "{err}"
    );

    // Pods name claims as volumes.
    let (ok, _, err) = c.kubectl(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: nameless-claim}\nspec:\n  \
             containers: [{name: c, image: host}]\n  volumes: [{name: data, \
             persistentVolumeClaim: {}}]\n",
        ),
    );
    assert!(!ok);
    assert!(
        err.contains(
            "The Pod \"nameless-claim\" is invalid: spec.volumes[0].persistentVolumeClaim.claimName: \
             Required value"
        ),
        "{err}"
    );

    // None of the refused objects was stored.
    assert_eq!(
        k(&["get", "pvc", "-o", "name"], None),
        "persistentvolumeclaim/claim\npersistentvolumeclaim/no-class\n"
    );
    let volumes = k(&["get", "pv", "-o", "name"], None);
    assert!(!volumes.contains("no-source") && !volumes.contains("local-no-affinity"));
}
