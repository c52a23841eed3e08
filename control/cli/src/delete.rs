//! `skiff delete`: by type and name, by selector, or everything in manifests.

use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use skiff_api::DynKind;
use skiff_client::{Client, ClientError, DeleteParams, ListParams, PropagationPolicy};

use crate::resources::{self, Target, kind_ref};
use crate::server_message;
use skiff_api::columns::name_of;

/// `--cascade`: kubectl's values, plus its legacy `true`/`false`.
pub fn parse_cascade(s: &str) -> Result<PropagationPolicy, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" => Ok(PropagationPolicy::Background),
        "false" => Ok(PropagationPolicy::Orphan),
        other => other.parse(),
    }
}

#[derive(Debug)]
pub struct DeleteOpts {
    pub resources: Vec<String>,
    pub files: Vec<String>,
    pub label_selector: String,
    pub all: bool,
    pub grace_period: Option<i64>,
    pub cascade: Option<PropagationPolicy>,
    pub ignore_not_found: bool,
    pub namespace: Option<String>,
    pub all_namespaces: bool,
}

/// One object to delete.
struct Victim {
    kind: &'static dyn DynKind,
    namespace: Option<String>,
    name: String,
}

/// `deployment.apps "web" deleted`.
pub fn deleted_message(kind: &dyn DynKind, name: &str) -> String {
    format!("{} \"{name}\" deleted", kind_ref(kind.info()))
}

async fn victims(client: &Client, opts: &DeleteOpts) -> Result<Vec<Victim>> {
    let ns_flag = opts.namespace.as_deref();
    if !opts.files.is_empty() {
        if !opts.resources.is_empty() {
            bail!("resources cannot be named both with -f and as arguments");
        }
        let docs = resources::parse_inputs(&resources::read_inputs(&opts.files)?)?;
        let mut out = Vec::new();
        for d in &docs {
            let ns = resources::document_namespace(d, ns_flag)?;
            out.push(Victim {
                kind: d.doc.kind,
                namespace: (!ns.is_empty()).then_some(ns),
                name: d.doc.name.clone(),
            });
        }
        // Namespaces last: deleting one deletes what is in it.
        out.sort_by_key(|v| v.kind.info().kind == "Namespace");
        return Ok(out);
    }
    let targets = resources::parse_targets(&opts.resources)?;
    let namespace = ns_flag.unwrap_or("default");
    let mut out = Vec::new();
    for Target { kind, names } in targets {
        let info = kind.info();
        let scope = info.namespaced.then_some(namespace);
        if !names.is_empty() {
            if opts.all || !opts.label_selector.is_empty() {
                bail!("name cannot be provided when a selector or --all is specified");
            }
            out.extend(names.into_iter().map(|name| Victim {
                kind,
                namespace: scope.map(String::from),
                name,
            }));
            continue;
        }
        if !opts.all && opts.label_selector.is_empty() {
            bail!(
                "resource(s) were provided, but no name was specified: give names, -l SELECTOR or --all"
            );
        }
        let list_scope = if opts.all_namespaces { None } else { scope };
        let items = client
            .dynamic(kind, list_scope)
            .list(&ListParams::default().labels(&opts.label_selector))
            .await?
            .items;
        out.extend(items.iter().map(|o| Victim {
            kind,
            namespace:
                Some(skiff_api::columns::namespace_of(o).to_string()).filter(|n| !n.is_empty()),
            name: name_of(o).to_string(),
        }));
    }
    Ok(out)
}

/// `skiff delete`.
pub async fn run(client: &Client, opts: &DeleteOpts) -> Result<ExitCode> {
    let victims = victims(client, opts).await?;
    if victims.is_empty() {
        eprintln!("No resources found");
        return Ok(ExitCode::SUCCESS);
    }
    let params = DeleteParams {
        grace_period_seconds: opts.grace_period.filter(|g| *g >= 0),
        propagation_policy: opts.cascade,
        preconditions: None,
    };
    let mut failed = false;
    for v in &victims {
        let api = client.dynamic(v.kind, v.namespace.as_deref());
        match api.delete(&v.name, &params).await {
            Ok(_) => crate::print_out(&deleted_message(v.kind, &v.name))?,
            Err(ClientError::NotFound { .. }) if opts.ignore_not_found => {}
            Err(e) if e.is_unreachable() => return Err(anyhow!(e)),
            Err(e) => {
                eprintln!("error: {}", server_message(&e, &v.name));
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cascade_values() {
        assert_eq!(
            parse_cascade("true").unwrap(),
            PropagationPolicy::Background
        );
        assert_eq!(parse_cascade("orphan").unwrap(), PropagationPolicy::Orphan);
        assert_eq!(
            parse_cascade("Foreground").unwrap(),
            PropagationPolicy::Foreground
        );
        assert!(parse_cascade("maybe").is_err());
    }

    #[test]
    fn deleted_message_like_kubectl() {
        let k = skiff_api::find_kind("deploy").unwrap();
        assert_eq!(deleted_message(k, "web"), "deployment.apps \"web\" deleted");
    }
}
