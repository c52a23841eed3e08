//! Naming resource types and objects the way kubectl does, and reading manifest files.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use skiff_api::manifest::{self, Document};
use skiff_api::{DynKind, KindInfo, find_kind};

/// Finds a resource type by any of its names (`po`, `pods`, `Pod`, `deployments.apps`).
pub fn resolve_kind(name: &str) -> Result<&'static dyn DynKind> {
    find_kind(name).ok_or_else(|| anyhow!("the server doesn't have a resource type {name:?}"))
}

/// `deployment.apps`, `service`, `lease.coordination.k8s.io`: how kubectl names a type in
/// messages.
pub fn kind_ref(info: &KindInfo) -> String {
    let kind = info.kind.to_ascii_lowercase();
    match info.group() {
        "" => kind,
        g => format!("{kind}.{g}"),
    }
}

/// `deployment.apps/web`.
pub fn object_ref(info: &KindInfo, name: &str) -> String {
    format!("{}/{name}", kind_ref(info))
}

/// What a `get`/`describe`/`delete` command line names: a type and maybe some objects.
#[derive(Clone)]
pub struct Target {
    pub kind: &'static dyn DynKind,
    /// Empty: every object (subject to selectors).
    pub names: Vec<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("kind", &self.kind.info().kind)
            .field("names", &self.names)
            .finish()
    }
}

/// The types `all` stands for.
const ALL: &[&str] = &["pods", "services", "deployments", "replicasets"];

/// Parses `KIND[,KIND] [NAME...]` or `KIND/NAME...`; `all` means pods, services,
/// deployments and replica sets.
pub fn parse_targets(args: &[String]) -> Result<Vec<Target>> {
    let Some(first) = args.first() else {
        bail!("you must specify the type of resource, e.g. `pods`, `deployments` or `svc`");
    };
    if first.contains('/') {
        let mut out: Vec<Target> = Vec::new();
        for a in args {
            let (kind, name) = a.split_once('/').filter(|(k, n)| !k.is_empty() && !n.is_empty()).ok_or_else(|| {
                anyhow!("there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (got {a:?})")
            })?;
            let kind = resolve_kind(kind)?;
            match out.last_mut() {
                Some(t) if t.kind.info().kind == kind.info().kind => t.names.push(name.into()),
                _ => out.push(Target {
                    kind,
                    names: vec![name.into()],
                }),
            }
        }
        return Ok(out);
    }
    let names: Vec<String> = args[1..].to_vec();
    if let Some(n) = names.iter().find(|n| n.contains('/')) {
        bail!("arguments in resource/name form must have a single resource and name (got {n:?})");
    }
    let mut out: Vec<Target> = Vec::new();
    for k in first.split(',').filter(|k| !k.is_empty()) {
        // kubectl's `all` category, as far as Skiff has its types.
        let expanded: Vec<&str> = if k.eq_ignore_ascii_case("all") {
            ALL.to_vec()
        } else {
            vec![k]
        };
        for k in expanded {
            let kind = resolve_kind(k)?;
            if out.iter().any(|t| t.kind.info().kind == kind.info().kind) {
                continue;
            }
            out.push(Target {
                kind,
                names: names.clone(),
            });
        }
    }
    if out.is_empty() {
        bail!("you must specify the type of resource");
    }
    Ok(out)
}

/// A checked manifest document and where it came from.
#[derive(Debug)]
pub struct Loaded {
    /// The file name (or `-` for stdin).
    pub source: String,
    /// 1-based position among the file's non-empty documents.
    pub index: usize,
    pub doc: Document,
    /// The document as written (before decoding), to tell fields the user set from
    /// defaults the decoding filled in.
    pub raw: serde_json::Value,
}

/// The non-empty documents of a YAML/JSON text as JSON values, in the order
/// [`manifest::parse`] returns them.
fn raw_documents(text: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    yaml_serde::Deserializer::from_str(text)
        .filter_map(|de| yaml_serde::Value::deserialize(de).ok())
        .filter(|y| !y.is_null())
        .map(|y| serde_json::to_value(&y).unwrap_or(serde_json::Value::Null))
        .collect()
}

/// Reads every `-f` argument: a file, a directory (its `*.yaml`, `*.yml` and `*.json` files,
/// sorted) or `-` (standard input). Returns (source name, text) pairs.
pub fn read_inputs(paths: &[String]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for p in paths {
        if p == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading standard input")?;
            out.push(("-".to_string(), text));
            continue;
        }
        let path = Path::new(p);
        let meta = std::fs::metadata(path).map_err(|_| anyhow!("the path {p:?} does not exist"))?;
        if meta.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .with_context(|| format!("reading directory {p}"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.is_file()
                        && matches!(
                            f.extension().and_then(|e| e.to_str()),
                            Some("yaml" | "yml" | "json")
                        )
                })
                .collect();
            files.sort();
            if files.is_empty() {
                bail!("no manifest files (*.yaml, *.yml, *.json) in directory {p:?}");
            }
            for f in files {
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?;
                out.push((f.display().to_string(), text));
            }
        } else {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {p}"))?;
            out.push((p.clone(), text));
        }
    }
    Ok(out)
}

/// Parses and checks every document of every input. The first bad document fails the whole
/// lot, naming the file, the document number and the field path.
pub fn parse_inputs(inputs: &[(String, String)]) -> Result<Vec<Loaded>> {
    let mut out = Vec::new();
    for (source, text) in inputs {
        let docs = manifest::parse(text).map_err(|e| anyhow!("{source}: {e}"))?;
        let mut raws = raw_documents(text).into_iter();
        for (i, doc) in docs.into_iter().enumerate() {
            let raw = raws.next().unwrap_or(serde_json::Value::Null);
            let index = i + 1;
            if doc.name.is_empty() {
                bail!("{source}: document {index}: metadata.name: required field is missing");
            }
            out.push(Loaded {
                source: source.clone(),
                index,
                doc,
                raw,
            });
        }
    }
    if out.is_empty() {
        bail!("no objects passed to apply");
    }
    Ok(out)
}

/// The namespace an object from a manifest goes to: its own, else `-n` (else `default`).
/// Fails when `-n` was given and differs from the document's, like kubectl. Cluster-scoped
/// kinds get none.
pub fn document_namespace(loaded: &Loaded, flag: Option<&str>) -> Result<String> {
    let info = loaded.doc.kind.info();
    if !info.namespaced {
        return Ok(String::new());
    }
    let own = loaded.doc.namespace.as_str();
    match (own, flag) {
        ("", f) => Ok(f.unwrap_or("default").to_string()),
        (own, Some(f)) if f != own => bail!(
            "{}: document {}: the namespace from the provided object {own:?} does not match the namespace {f:?}. You must pass '--namespace={own}' to perform this operation.",
            loaded.source,
            loaded.index
        ),
        (own, _) => Ok(own.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kind_refs_like_kubectl() {
        let info = |n| resolve_kind(n).unwrap().info();
        assert_eq!(kind_ref(info("deploy")), "deployment.apps");
        assert_eq!(kind_ref(info("svc")), "service");
        assert_eq!(kind_ref(info("lease")), "lease.coordination.k8s.io");
        assert_eq!(object_ref(info("ns"), "shop"), "namespace/shop");
        let err = resolve_kind("widgets").err().unwrap();
        assert_eq!(
            err.to_string(),
            "the server doesn't have a resource type \"widgets\""
        );
    }

    #[test]
    fn targets_from_args() {
        let t = parse_targets(&args(&["deploy,svc", "web"])).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].kind.info().kind, "Service");
        assert_eq!(t[1].names, vec!["web"]);
        let t = parse_targets(&args(&["deploy/web", "deploy/api", "svc/web"])).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].names, vec!["web", "api"]);
        assert!(parse_targets(&args(&["deploy/web", "svc"])).is_err());
        let all = parse_targets(&args(&["all"])).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].kind.info().kind, "Pod");
        assert!(parse_targets(&args(&["pods", "svc/web"])).is_err());
        assert!(parse_targets(&args(&["widgets"])).is_err());
        assert!(parse_targets(&[]).is_err());
    }

    #[test]
    fn bad_document_names_file_document_and_path() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
                    apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {portz: []}\n";
        let err = parse_inputs(&[("x.yaml".into(), text.into())]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.yaml: document 2: spec.portz: unknown field"
        );
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {}\n";
        let err = parse_inputs(&[("y.yaml".into(), text.into())]).unwrap_err();
        assert!(err.to_string().contains("metadata.name"), "{err}");
    }

    #[test]
    fn namespaces_of_documents() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: shop}\n---\n\
                    apiVersion: v1\nkind: Service\nmetadata: {name: t}\n---\n\
                    apiVersion: v1\nkind: Namespace\nmetadata: {name: n}\n";
        let docs = parse_inputs(&[("x.yaml".into(), text.into())]).unwrap();
        assert_eq!(document_namespace(&docs[0], None).unwrap(), "shop");
        assert_eq!(document_namespace(&docs[0], Some("shop")).unwrap(), "shop");
        assert!(document_namespace(&docs[0], Some("other")).is_err());
        assert_eq!(document_namespace(&docs[1], None).unwrap(), "default");
        assert_eq!(document_namespace(&docs[1], Some("x")).unwrap(), "x");
        assert_eq!(document_namespace(&docs[2], Some("x")).unwrap(), "");
    }

    #[test]
    fn directories_are_read_sorted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.yaml"), "b").unwrap();
        std::fs::write(dir.path().join("a.yml"), "a").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let got = read_inputs(&[dir.path().display().to_string()]).unwrap();
        let texts: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, vec!["a", "b"]);
        let err = read_inputs(&["/nonexistent/x.yaml".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the path \"/nonexistent/x.yaml\" does not exist"
        );
    }
}
