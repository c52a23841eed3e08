//! `skiff scale`: sets `spec.replicas` of deployments and replica sets.

use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use serde_json::Value;
use skiff_client::{Client, DynamicApi};

use crate::resources::{Target, kind_ref, object_ref};
use crate::update::{self, retry_on_conflict};

/// The kinds that have `spec.replicas`.
const SCALABLE: &[&str] = &["Deployment", "ReplicaSet"];

#[derive(Debug)]
pub struct ScaleOpts {
    pub targets: Vec<Target>,
    pub replicas: i32,
    /// Only scale if the object has this many replicas now (`--current-replicas`).
    pub current_replicas: Option<i32>,
    pub namespace: String,
}

/// Checks what can be checked before talking to the server: the counts and the kinds.
pub fn check(opts: &ScaleOpts) -> Result<()> {
    if opts.replicas < 0 {
        bail!(
            "--replicas: must be greater than or equal to 0 (got {})",
            opts.replicas
        );
    }
    if let Some(c) = opts.current_replicas.filter(|c| *c < 0) {
        bail!("--current-replicas: must be greater than or equal to 0 (got {c})");
    }
    for t in &opts.targets {
        let info = t.kind.info();
        if !SCALABLE.contains(&info.kind) {
            bail!(
                "cannot scale {}: only deployments and replicasets have replicas",
                info.plural
            );
        }
        if t.names.is_empty() {
            bail!(
                "you must name the {} to scale, e.g. `skiff scale {}/NAME --replicas=N`",
                info.plural,
                info.short_names.first().copied().unwrap_or(info.plural)
            );
        }
    }
    Ok(())
}

/// `spec.replicas` of an object as JSON (the server defaults it to 1).
fn replicas_of(obj: &Value) -> i64 {
    obj.pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// Scales one object; the precondition is checked against every fresh read.
async fn scale_one(api: &DynamicApi, name: &str, opts: &ScaleOpts) -> Result<()> {
    let what = object_ref(api.kind().info(), name);
    retry_on_conflict(&what, || async {
        let mut obj = api.get(name).await?;
        let current = replicas_of(&obj);
        if let Some(want) = opts.current_replicas
            && current != i64::from(want)
        {
            bail!(
                "{what}: expected replicas to be {want} (--current-replicas), but it is {current}"
            );
        }
        if current == i64::from(opts.replicas) {
            return Ok(());
        }
        let spec = obj
            .pointer_mut("/spec")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| anyhow!("{what}: the object has no spec"))?;
        spec.insert("replicas".into(), Value::from(opts.replicas));
        api.update(&obj).await?;
        Ok(())
    })
    .await
}

/// `skiff scale`.
pub async fn run(client: &Client, opts: &ScaleOpts) -> Result<ExitCode> {
    check(opts)?;
    let mut failed = false;
    for t in &opts.targets {
        let api = client.dynamic(t.kind, Some(&opts.namespace));
        for name in &t.names {
            match scale_one(&api, name, opts).await {
                Ok(()) => crate::print_out(&format!("{}/{name} scaled", kind_ref(t.kind.info())))?,
                Err(e) if update::is_unreachable(&e) => return Err(e),
                Err(e) => {
                    eprintln!("error: {}", update::error_line(&e, name));
                    failed = true;
                }
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
    use crate::resources::parse_targets;

    fn opts(args: &[&str], replicas: i32, current: Option<i32>) -> ScaleOpts {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        ScaleOpts {
            targets: parse_targets(&args).unwrap(),
            replicas,
            current_replicas: current,
            namespace: "default".into(),
        }
    }

    #[test]
    fn checks_counts_and_kinds() {
        assert!(check(&opts(&["deploy/web"], 3, Some(2))).is_ok());
        assert!(check(&opts(&["rs", "a", "b"], 0, None)).is_ok());
        assert_eq!(
            check(&opts(&["deploy/web"], -1, None))
                .unwrap_err()
                .to_string(),
            "--replicas: must be greater than or equal to 0 (got -1)"
        );
        assert_eq!(
            check(&opts(&["deploy/web"], 1, Some(-2)))
                .unwrap_err()
                .to_string(),
            "--current-replicas: must be greater than or equal to 0 (got -2)"
        );
        assert_eq!(
            check(&opts(&["pods", "p"], 1, None))
                .unwrap_err()
                .to_string(),
            "cannot scale pods: only deployments and replicasets have replicas"
        );
        assert_eq!(
            check(&opts(&["deploy"], 1, None)).unwrap_err().to_string(),
            "you must name the deployments to scale, e.g. `skiff scale deploy/NAME --replicas=N`"
        );
    }

    #[test]
    fn replicas_default_to_one() {
        assert_eq!(
            replicas_of(&serde_json::json!({"spec": {"replicas": 4}})),
            4
        );
        assert_eq!(replicas_of(&serde_json::json!({"spec": {}})), 1);
    }
}
