//! CustomResourceDefinitions extend the API as they extend Kubernetes', driven by kubectl
//! 1.32 on a real cluster: the CronTab definition of Kubernetes' documentation is applied,
//! becomes Established with its names accepted, and its kind is served like a typed one
//! (discovery, `kubectl explain`, printer columns, short names and the `all` category,
//! schema validation with Kubernetes' messages, pruning and strict field validation,
//! defaults, the status and scale subresources, field selectors, server-side apply, watch);
//! a second definition that takes a used name gets NamesAccepted False; definitions that
//! break the rules are refused; deleting the namespace deletes its custom objects, and
//! deleting the definition deletes the rest and stops serving the kind. Attacks: a definition
//! that would take a typed kind's names is not served, a cluster-scoped kind is not reached
//! through a namespaced path, and RBAC grants custom kinds only where a rule names them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "an end-to-end test: a failed step is the test's failure"
)]

use std::time::{Duration, Instant};

use skiff_tests::cluster::Cluster;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  versions:
    - name: v1
      served: true
      storage: true
      schema: &schema
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              description: What the cron job runs, and how often.
              properties:
                cronSpec:
                  type: string
                  pattern: '^(\d+|\*)(/\d+)?(\s+(\d+|\*)(/\d+)?){4}$'
                image:
                  type: string
                replicas:
                  type: integer
                  minimum: 1
                  maximum: 10
                  default: 1
                color:
                  type: string
                  enum: [red, green]
                ports:
                  type: array
                  x-kubernetes-list-type: map
                  x-kubernetes-list-map-keys: [port, protocol]
                  items:
                    type: object
                    required: [port, protocol]
                    properties:
                      port: {type: integer}
                      protocol: {type: string}
              required: [cronSpec]
            status:
              type: object
              properties:
                replicas:
                  type: integer
                selector:
                  type: string
      subresources:
        status: {}
        scale:
          specReplicasPath: .spec.replicas
          statusReplicasPath: .status.replicas
          labelSelectorPath: .status.selector
      additionalPrinterColumns:
        - name: Spec
          type: string
          jsonPath: .spec.cronSpec
        - name: Replicas
          type: integer
          jsonPath: .spec.replicas
        - name: Age
          type: date
          jsonPath: .metadata.creationTimestamp
      selectableFields:
        - jsonPath: .spec.color
    - name: v1beta1
      served: true
      storage: false
      schema: *schema
  scope: Namespaced
  names:
    plural: crontabs
    singular: crontab
    kind: CronTab
    shortNames: [ct]
    categories: [all]
"#;

const T: Duration = Duration::from_secs(60);

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_extend_the_api() {
    let c = Cluster::start(0).await;
    let kubectl = |args: &[&str]| c.kubectl(args, None);
    let apply = |yaml: &str| c.kubectl(&["apply", "-f", "-"], Some(yaml));

    // The definition is applied and established.
    let (ok, _, err) = apply(CRD);
    assert!(ok, "{err}\n{}", c.logs());
    let (ok, out, err) = kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/crontabs.stable.example.com",
    ]);
    assert!(ok, "{out}{err}\n{}", c.logs());
    let (ok, out, _) = kubectl(&[
        "get",
        "crd",
        "crontabs.stable.example.com",
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status}/{.reason} {end}|{.status.acceptedNames.kind}|{.status.storedVersions}",
    ]);
    assert!(ok);
    assert!(out.contains("NamesAccepted=True/NoConflicts"), "{out}");
    assert!(
        out.contains("Established=True/InitialNamesAccepted"),
        "{out}"
    );
    assert!(out.contains("|CronTab|"), "{out}");
    assert!(out.contains("v1"), "{out}");

    // Discovery lists the kind with its short name; explain reads its schema.
    let (ok, out, err) = kubectl(&["api-resources", "--api-group=stable.example.com"]);
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("crontabs"))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["crontabs", "ct", "stable.example.com/v1", "true", "CronTab"],
        "{out}"
    );
    let (ok, out, err) = kubectl(&["explain", "crontab.spec"]);
    assert!(ok, "{err}");
    assert!(out.contains("cronSpec"), "{out}");
    assert!(out.contains("What the cron job runs"), "{out}");

    // Both versions are served (the None conversion: only apiVersion differs); v1 is
    // preferred.
    let (_, out, _) = kubectl(&["get", "--raw", "/apis/stable.example.com"]);
    let group: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(group["preferredVersion"]["version"], "v1", "{group}");
    assert_eq!(group["versions"][1]["version"], "v1beta1", "{group}");

    // An object: defaults filled, unknown fields refused by kubectl's strict validation.
    let good = r#"
apiVersion: stable.example.com/v1
kind: CronTab
metadata:
  name: my-new-cron-object
spec:
  cronSpec: "* * * * */5"
  image: my-awesome-cron-image
  color: red
"#;
    let (ok, _, err) = apply(good);
    assert!(ok, "{err}\n{}", c.logs());
    let (ok, out, _) = kubectl(&[
        "get",
        "ct",
        "my-new-cron-object",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert!(ok);
    assert_eq!(out, "1", "the schema's default");
    let (ok, out, err) = kubectl(&["get", "crontabs"]);
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SPEC", "REPLICAS", "AGE"], "{out}");
    assert!(
        out.contains("my-new-cron-object   * * * * */5   1"),
        "{out}"
    );
    let (ok, out, _) = kubectl(&["get", "all"]);
    assert!(ok);
    assert!(
        out.contains("crontab.stable.example.com/my-new-cron-object"),
        "{out}"
    );

    let unknown = good.replace("color: red", "color: red\n  colour: blue");
    let (ok, _, err) = apply(&unknown);
    assert!(!ok);
    assert!(err.contains(r#"unknown field "spec.colour""#), "{err}");

    // Schema violations are refused with Kubernetes' field paths and messages.
    let bad = r#"
apiVersion: stable.example.com/v1
kind: CronTab
metadata:
  name: bad
spec:
  cronSpec: "not a cron spec"
  replicas: 20
  color: purple
"#;
    let (ok, _, err) = apply(bad);
    assert!(!ok);
    assert!(err.contains(r#"The CronTab "bad" is invalid"#), "{err}");
    assert!(
        err.contains("spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10"),
        "{err}"
    );
    assert!(
        err.contains(
            r#"spec.color: Unsupported value: "purple": supported values: "red", "green""#
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "spec.cronSpec: Invalid value: \"not a cron spec\": spec.cronSpec in body should match"
        ),
        "{err}"
    );
    let (ok, _, err) = apply(
        "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: empty\nspec:\n  image: x\n",
    );
    assert!(!ok);
    assert!(err.contains("spec.cronSpec: Required value"), "{err}");

    // The status subresource: the main endpoint keeps the status, /status takes it.
    let (ok, _, err) = kubectl(&[
        "patch",
        "crontab",
        "my-new-cron-object",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":1,"selector":"app=cron"}}"#,
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&[
        "patch",
        "crontab",
        "my-new-cron-object",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":7}}"#,
    ]);
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(&[
        "get",
        "ct",
        "my-new-cron-object",
        "-o",
        "jsonpath={.status.replicas}/{.metadata.generation}",
    ]);
    assert_eq!(
        out, "1/1",
        "a main-endpoint write of the status changes nothing"
    );

    // The scale subresource through the definition's paths.
    let (ok, _, err) = kubectl(&["scale", "crontab", "my-new-cron-object", "--replicas=3"]);
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(&[
        "get",
        "--raw",
        "/apis/stable.example.com/v1/namespaces/default/crontabs/my-new-cron-object/scale",
    ]);
    let scale: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(scale["spec"]["replicas"], 3, "{scale}");
    assert_eq!(scale["status"]["replicas"], 1, "{scale}");
    assert_eq!(scale["status"]["selector"], "app=cron", "{scale}");
    let (_, out, _) = kubectl(&[
        "get",
        "ct",
        "my-new-cron-object",
        "-o",
        "jsonpath={.metadata.generation}",
    ]);
    assert_eq!(out, "2", "a spec change bumps the generation");

    // Written at v1beta1, stored at v1, read at either.
    let (ok, _, err) = apply(
        &good
            .replace("my-new-cron-object", "beta-one")
            .replace("stable.example.com/v1", "stable.example.com/v1beta1"),
    );
    assert!(ok, "{err}");
    let path = "/namespaces/default/crontabs/beta-one";
    let (_, out, _) = kubectl(&[
        "get",
        "--raw",
        &format!("/apis/stable.example.com/v1{path}"),
    ]);
    let v1: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v1["apiVersion"], "stable.example.com/v1", "{v1}");
    assert_eq!(v1["spec"]["replicas"], 1, "defaulted: {v1}");
    let (_, out, _) = kubectl(&[
        "get",
        "--raw",
        &format!("/apis/stable.example.com/v1beta1{path}"),
    ]);
    let beta: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(beta["apiVersion"], "stable.example.com/v1beta1", "{beta}");
    assert_eq!(beta["metadata"]["uid"], v1["metadata"]["uid"]);
    let (ok, out, err) = kubectl(&["delete", "crontabs.v1beta1.stable.example.com", "beta-one"]);
    assert!(ok, "{out}{err}");

    // Field selectors on the definition's selectable fields.
    let (ok, _, err) = apply(
        &good
            .replace("my-new-cron-object", "green-one")
            .replace("color: red", "color: green"),
    );
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&[
        "get",
        "ct",
        "--field-selector=spec.color=green",
        "-o",
        "name",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "crontab.stable.example.com/green-one");
    let (ok, _, err) = kubectl(&["get", "ct", "--field-selector=spec.image=x"]);
    assert!(!ok);
    assert!(err.contains("field label not supported"), "{err}");

    // Server-side apply.
    let (ok, _, err) = c.kubectl(
        &["apply", "--server-side", "-f", "-"],
        Some(&good.replace("my-new-cron-object", "applied")),
    );
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(&[
        "get",
        "ct",
        "applied",
        "-o",
        "jsonpath={.metadata.managedFields[0].manager}",
    ]);
    assert_eq!(out, "kubectl");
    // Two managers apply items of a map list (keyed by port and protocol): the items merge,
    // and a manager that drops its item removes only that one.
    let with_port = |manager: &str, ports: &str| {
        let applied = format!(
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: applied\n\
             spec:\n  ports: {ports}\n"
        );
        let manager = format!("--field-manager={manager}");
        let (ok, _, err) = c.kubectl(
            &["apply", "--server-side", &manager, "-f", "-"],
            Some(&applied),
        );
        assert!(ok, "{err}");
    };
    let ports = || kubectl(&["get", "ct", "applied", "-o", "jsonpath={.spec.ports}"]).1;
    with_port("one", "[{port: 80, protocol: TCP}]");
    with_port("two", "[{port: 80, protocol: UDP}]");
    assert_eq!(
        ports(),
        r#"[{"port":80,"protocol":"TCP"},{"port":80,"protocol":"UDP"}]"#
    );
    let (_, fields, _) = kubectl(&[
        "get",
        "ct",
        "applied",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[?(@.manager==\"two\")].fieldsV1}",
    ]);
    assert!(
        fields.contains(r#"k:{\"port\":80,\"protocol\":\"UDP\"}"#),
        "{fields}"
    );
    with_port("one", "[]");
    assert_eq!(ports(), r#"[{"port":80,"protocol":"UDP"}]"#);

    // A second definition may not take a name in use in its group.
    let clash = CRD
        .replace(
            "crontabs.stable.example.com",
            "crontimers.stable.example.com",
        )
        .replace("plural: crontabs", "plural: crontimers")
        .replace("singular: crontab", "singular: crontimer");
    let (ok, _, err) = apply(&clash);
    assert!(ok, "{err}");
    wait_for("the clash's NamesAccepted condition", || {
        let (_, out, _) = kubectl(&[
            "get",
            "crd",
            "crontimers.stable.example.com",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="NamesAccepted")].reason}"#,
        ]);
        out == "ListKindConflict" || out == "KindConflict" || out == "ShortNamesConflict"
    });
    let (ok, _, _) = kubectl(&["get", "crontimers"]);
    assert!(!ok, "a definition without accepted names is not served");

    // Definitions that break the rules are refused with Kubernetes' messages.
    let misnamed = CRD.replace(
        "name: crontabs.stable.example.com",
        "name: crons.stable.example.com",
    );
    let (ok, _, err) = apply(&misnamed);
    assert!(!ok);
    assert!(
        err.contains(r#"metadata.name: Invalid value: "crons.stable.example.com": must be spec.names.plural+"."+spec.group"#),
        "{err}"
    );
    let non_structural = CRD
        .replace("crontabs.stable", "widgets.stable")
        .replace("plural: crontabs", "plural: widgets")
        .replace("singular: crontab", "singular: widget")
        .replace("kind: CronTab", "kind: Widget")
        .replace("shortNames: [ct]", "shortNames: [wd]")
        .replace(
            "            spec:\n              type: object\n",
            "            spec:\n",
        );
    let (ok, _, err) = apply(&non_structural);
    assert!(!ok);
    assert!(
        err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"),
        "{err}"
    );

    // Attacks. A definition cannot take over a typed kind's names (it would capture its
    // requests): RBAC's ClusterRoles stay served.
    let hijack = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterroles.rbac.authorization.k8s.io
spec:
  group: rbac.authorization.k8s.io
  scope: Cluster
  names: {plural: clusterroles, singular: clusterrole, kind: ClusterRole}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;
    let (ok, _, err) = apply(hijack);
    assert!(ok, "{err}");
    wait_for("the hijack's NamesAccepted condition", || {
        let (_, out, _) = kubectl(&[
            "get",
            "crd",
            "clusterroles.rbac.authorization.k8s.io",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="NamesAccepted")].status}"#,
        ]);
        out == "False"
    });
    let (ok, out, err) = kubectl(&[
        "get",
        "clusterrole",
        "cluster-admin",
        "-o",
        "jsonpath={.rules[0].verbs}",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, r#"["*"]"#);
    let (ok, _, err) = kubectl(&["delete", "crd", "clusterroles.rbac.authorization.k8s.io"]);
    assert!(ok, "{err}");
    let (ok, _, _) = kubectl(&["get", "clusterrole", "cluster-admin"]);
    assert!(
        ok,
        "deleting the refused definition deleted nothing of the typed kind"
    );

    // A cluster-scoped kind is not reachable through a namespaced path (CVE-2019-11247).
    let cluster_scoped = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.org
spec:
  group: example.org
  scope: Cluster
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, properties: {size: {type: integer}}}
"#;
    let (ok, _, err) = apply(cluster_scoped);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/widgets.example.org",
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = apply(
        "apiVersion: example.org/v1
kind: Widget
metadata:
  name: w1
spec:
  size: 2
",
    );
    assert!(ok, "{err}");
    let (ok, _, _) = kubectl(&["get", "--raw", "/apis/example.org/v1/widgets/w1"]);
    assert!(ok);
    let (ok, _, err) = kubectl(&[
        "get",
        "--raw",
        "/apis/example.org/v1/namespaces/default/widgets/w1",
    ]);
    assert!(!ok && err.contains("NotFound"), "{err}");

    // RBAC covers custom kinds: `edit` in a namespace grants none of them, a Role naming one
    // grants it.
    let (ok, _, err) = kubectl(&[
        "create",
        "rolebinding",
        "alice-edit",
        "--clusterrole=edit",
        "--user=alice",
        "-n",
        "default",
    ]);
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(&[
        "auth",
        "can-i",
        "list",
        "crontabs.stable.example.com",
        "--as=alice",
        "-n",
        "default",
    ]);
    assert_eq!(out.trim(), "no");
    let (ok, _, err) = kubectl(&["get", "ct", "--as=alice", "-n", "default"]);
    assert!(!ok && err.contains("forbidden"), "{err}");
    let (ok, _, err) = kubectl(&[
        "create",
        "role",
        "crontab-reader",
        "--verb=get,list",
        "--resource=crontabs.stable.example.com",
        "-n",
        "default",
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&[
        "create",
        "rolebinding",
        "alice-crontabs",
        "--role=crontab-reader",
        "--user=alice",
        "-n",
        "default",
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&["get", "ct", "--as=alice", "-n", "default", "-o", "name"]);
    assert!(ok, "{err}");
    assert!(out.contains("my-new-cron-object"), "{out}");
    let (ok, _, _) = kubectl(&["get", "widgets", "--as=alice"]);
    assert!(!ok, "the Role names crontabs only");
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-", "--as=alice"], Some(hijack));
    assert!(!ok && err.contains("forbidden"), "{err}");

    // A watch sees custom objects change.
    let mut watch = c.server.kubectl_cmd(&[
        "get",
        "ct",
        "--watch",
        "-o",
        "name",
        "--request-timeout=20s",
    ]);
    let child = watch
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl watch");
    std::thread::sleep(Duration::from_secs(1));
    let (ok, _, err) = kubectl(&["delete", "ct", "applied"]);
    assert!(ok, "{err}");
    let out = child.wait_with_output().expect("watch output");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("crontab.stable.example.com/applied"),
        "{seen}"
    );

    // Deleting a namespace deletes its custom objects.
    let (ok, _, err) = kubectl(&["create", "namespace", "cron-ns"]);
    assert!(ok, "{err}");
    let (ok, _, err) = c.kubectl(
        &["apply", "-n", "cron-ns", "-f", "-"],
        Some(&good.replace("my-new-cron-object", "in-ns")),
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&["delete", "namespace", "cron-ns", "--timeout=60s"]);
    assert!(ok, "{err}\n{}", c.logs());
    let (_, out, _) = kubectl(&["get", "ct", "-A", "-o", "name"]);
    assert!(!out.contains("in-ns"), "{out}");

    // Deleting the definition deletes its objects and stops serving the kind.
    let (ok, _, err) = kubectl(&[
        "delete",
        "crd",
        "crontabs.stable.example.com",
        "--timeout=60s",
    ]);
    assert!(ok, "{err}\n{}", c.logs());
    // kubectl's discovery cache may still name the kind: then the list is a 404.
    let (ok, _, err) = kubectl(&["get", "crontabs"]);
    assert!(!ok);
    assert!(
        err.contains(r#"the server doesn't have a resource type "crontabs""#)
            || err.contains("the server could not find the requested resource"),
        "{err}"
    );
    // The names it held are free again: the definition that wanted them gets them.
    let (ok, _, err) = kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/crontimers.stable.example.com",
    ]);
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(&["get", "--raw", "/apis/stable.example.com/v1"]);
    assert!(
        out.contains(r#""name":"crontimers""#) && !out.contains(r#""name":"crontabs""#),
        "{out}"
    );
    let (ok, _, err) = kubectl(&["delete", "crd", "crontimers.stable.example.com"]);
    assert!(ok, "{err}");
    // A new definition of the same kind starts empty.
    let (ok, _, err) = apply(CRD);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/crontabs.stable.example.com",
    ]);
    assert!(ok, "{err}");
    wait_for("the recreated kind to be served empty", || {
        let (ok, out, _) = kubectl(&["get", "ct", "-A", "-o", "name"]);
        ok && out.trim().is_empty()
    });
}
