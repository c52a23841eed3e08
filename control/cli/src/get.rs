//! `skiff get`: tables, YAML/JSON, names, and `-w` watching.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::Value;
use skiff_api::DynKind;
use skiff_client::{Client, ListParams, WatchEvent};

use crate::output;
use crate::resources::{Target, kind_ref};
use crate::table;
use crate::{print_out, server_message};
use skiff_api::columns::{self, name_of, namespace_of, str_at};

/// `-o` formats of `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GetOutput {
    /// The table with more columns.
    Wide,
    Yaml,
    Json,
    /// `kind/name` lines.
    Name,
}

#[derive(Debug)]
pub struct GetOpts {
    pub targets: Vec<Target>,
    pub label_selector: String,
    pub field_selector: String,
    pub output: Option<GetOutput>,
    pub watch: bool,
    pub show_labels: bool,
    pub namespace: String,
    pub all_namespaces: bool,
}

impl GetOpts {
    /// The namespace to work in for `kind`; `None` for all (or a cluster-scoped kind).
    fn scope(&self, kind: &dyn DynKind) -> Option<&str> {
        (kind.info().namespaced && !self.all_namespaces).then_some(self.namespace.as_str())
    }

    fn list_params(&self) -> ListParams {
        ListParams::default()
            .labels(&self.label_selector)
            .fields(&self.field_selector)
    }

    fn no_resources(&self) -> String {
        let namespaced = self.targets.iter().any(|t| t.kind.info().namespaced);
        if namespaced && !self.all_namespaces {
            format!("No resources found in {} namespace.", self.namespace)
        } else {
            "No resources found".to_string()
        }
    }
}

/// How rows of one kind are laid out.
#[derive(Debug, Clone)]
pub struct Layout {
    pub kind: &'static str,
    pub wide: bool,
    /// A NAMESPACE column first (`-A` on a namespaced kind).
    pub namespace_column: bool,
    pub show_labels: bool,
    /// Prefix of the NAME cell (`deployment.apps/`) when several kinds are shown.
    pub name_prefix: Option<String>,
}

fn labels_cell(obj: &Value) -> String {
    let labels: Vec<String> = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    if labels.is_empty() {
        "<none>".into()
    } else {
        labels.join(",")
    }
}

impl Layout {
    pub fn headers(&self) -> Vec<String> {
        let mut h = columns::headers(self.kind, self.wide);
        if self.namespace_column {
            h.insert(0, "NAMESPACE".into());
        }
        if self.show_labels {
            h.push("LABELS".into());
        }
        h
    }

    pub fn row(&self, obj: &Value, now: DateTime<Utc>) -> Vec<String> {
        let mut c = columns::cells(self.kind, obj, self.wide, now);
        if let Some(prefix) = &self.name_prefix
            && let Some(i) = columns::headers(self.kind, self.wide)
                .iter()
                .position(|h| h == "NAME")
        {
            c[i] = format!("{prefix}{}", c[i]);
        }
        if self.namespace_column {
            c.insert(0, namespace_of(obj).to_string());
        }
        if self.show_labels {
            c.push(labels_cell(obj));
        }
        c
    }

    /// The table of `items`, header first.
    pub fn table(&self, items: &[Value], now: DateTime<Utc>) -> Vec<String> {
        let rows: Vec<Vec<String>> = items.iter().map(|o| self.row(o, now)).collect();
        table::render(&self.headers(), &rows)
    }
}

fn sort_items(kind: &str, items: &mut [Value]) {
    if kind == "Event" {
        // Oldest first, like a log.
        items.sort_by_cached_key(|e| {
            let ev: skiff_api::api::Event = serde_json::from_value(e.clone()).unwrap_or_default();
            DateTime::parse_from_rfc3339(columns::event_time(&ev)).ok()
        });
    }
}

struct Fetched {
    kind: &'static dyn DynKind,
    items: Vec<Value>,
}

/// `skiff get`.
pub async fn run(client: &Client, opts: &GetOpts) -> Result<ExitCode> {
    if opts.watch {
        return watch(client, opts).await;
    }
    let now = Utc::now();
    let mut failed = false;
    let mut fetched = Vec::new();
    for t in &opts.targets {
        let api = client.dynamic(t.kind, opts.scope(t.kind));
        let mut items = Vec::new();
        if t.names.is_empty() {
            items = api.list(&opts.list_params()).await?.items;
            sort_items(t.kind.info().kind, &mut items);
        } else {
            for n in &t.names {
                match api.get(n).await {
                    Ok(v) => items.push(v),
                    Err(e) if e.is_unreachable() => return Err(anyhow!(e)),
                    Err(e) => {
                        eprintln!("error: {}", server_message(&e, n));
                        failed = true;
                    }
                }
            }
        }
        fetched.push(Fetched {
            kind: t.kind,
            items,
        });
    }
    let any_names = opts.targets.iter().any(|t| !t.names.is_empty());
    let total: usize = fetched.iter().map(|f| f.items.len()).sum();
    match opts.output {
        Some(GetOutput::Yaml) | Some(GetOutput::Json) => {
            let single = opts.targets.len() == 1 && opts.targets[0].names.len() == 1;
            let mut all: Vec<Value> = fetched.into_iter().flat_map(|f| f.items).collect();
            let v = if single && all.len() == 1 {
                all.remove(0)
            } else if all.is_empty() && any_names {
                return Ok(exit(failed));
            } else {
                output::list(all)
            };
            let text = if opts.output == Some(GetOutput::Yaml) {
                output::to_yaml(&v)?
            } else {
                output::to_json(&v)?
            };
            print_out(text.trim_end())?;
        }
        Some(GetOutput::Name) => {
            for f in &fetched {
                for o in &f.items {
                    print_out(&format!("{}/{}", kind_ref(f.kind.info()), name_of(o)))?;
                }
            }
        }
        None | Some(GetOutput::Wide) => {
            let multi = opts.targets.len() > 1;
            let mut blocks = Vec::new();
            for f in fetched.iter().filter(|f| !f.items.is_empty()) {
                let layout = layout_for(opts, f.kind, multi);
                blocks.push(layout.table(&f.items, now).join("\n"));
            }
            if !blocks.is_empty() {
                print_out(&blocks.join("\n\n"))?;
            }
        }
    }
    if total == 0 && !any_names {
        eprintln!("{}", opts.no_resources());
    }
    Ok(exit(failed))
}

fn exit(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn layout_for(opts: &GetOpts, kind: &'static dyn DynKind, multi: bool) -> Layout {
    Layout {
        kind: kind.info().kind,
        wide: opts.output == Some(GetOutput::Wide),
        namespace_column: opts.all_namespaces && kind.info().namespaced,
        show_labels: opts.show_labels,
        name_prefix: multi.then(|| format!("{}/", kind_ref(kind.info()))),
    }
}

/// Prints watched objects in the chosen format; table rows share the columns of the first
/// table and widen when needed.
struct WatchPrinter {
    layout: Layout,
    /// `deployment.apps` for `-o name`.
    kind_ref: String,
    output: Option<GetOutput>,
    widths: Option<Vec<usize>>,
}

impl WatchPrinter {
    fn print(&mut self, objs: &[Value]) -> Result<()> {
        if objs.is_empty() {
            return Ok(());
        }
        let now = Utc::now();
        match self.output {
            Some(GetOutput::Yaml) => {
                for o in objs {
                    print_out(&format!("---\n{}", output::to_yaml(o)?.trim_end()))?;
                }
            }
            Some(GetOutput::Json) => {
                for o in objs {
                    print_out(output::to_json(o)?.trim_end())?;
                }
            }
            Some(GetOutput::Name) => {
                for o in objs {
                    print_out(&format!("{}/{}", self.kind_ref, name_of(o)))?;
                }
            }
            None | Some(GetOutput::Wide) => {
                let rows: Vec<Vec<String>> = objs.iter().map(|o| self.layout.row(o, now)).collect();
                let widths = match &mut self.widths {
                    Some(w) => {
                        for r in &rows {
                            table::grow(w, r);
                        }
                        w
                    }
                    None => {
                        let headers = self.layout.headers();
                        let w = table::widths(&headers, &rows);
                        print_out(&table::format_row(&headers, &w))?;
                        self.widths.insert(w)
                    }
                };
                for r in &rows {
                    print_out(&table::format_row(r, widths))?;
                }
            }
        }
        Ok(())
    }
}

fn key(o: &Value) -> (String, String) {
    (namespace_of(o).to_string(), name_of(o).to_string())
}

fn rv(o: &Value) -> &str {
    str_at(o, "/metadata/resourceVersion")
}

/// `skiff get -w`: the current objects, then a row per change until Ctrl-C.
async fn watch(client: &Client, opts: &GetOpts) -> Result<ExitCode> {
    let [t] = opts.targets.as_slice() else {
        bail!("watch is only supported on a single resource type");
    };
    let mut lp = opts.list_params();
    match t.names.as_slice() {
        [] => {}
        [name] => {
            let by_name = format!("metadata.name={name}");
            lp.field_selector = if lp.field_selector.is_empty() {
                by_name
            } else {
                format!("{},{by_name}", lp.field_selector)
            };
        }
        _ => bail!("watch is only supported on a single object name"),
    }
    let api = client.dynamic(t.kind, opts.scope(t.kind));
    let mut printer = WatchPrinter {
        layout: layout_for(opts, t.kind, false),
        kind_ref: kind_ref(t.kind.info()),
        output: opts.output,
        widths: None,
    };
    let list = api.list(&lp).await?;
    let mut items = list.items;
    sort_items(t.kind.info().kind, &mut items);
    if items.is_empty() {
        eprintln!("{}", opts.no_resources());
    }
    printer.print(&items)?;
    let mut seen: HashMap<(String, String), String> =
        items.iter().map(|o| (key(o), rv(o).to_string())).collect();
    let mut resource_version = list.resource_version;

    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let mut stream = api.watch(&lp, &resource_version);
        loop {
            let next = tokio::select! {
                _ = &mut ctrl_c => return Ok(ExitCode::SUCCESS),
                next = stream.next() => next,
            };
            match next {
                None => {
                    tracing::debug!("watch ended; watching again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
                Some(Ok(ev)) => {
                    let obj = ev.object();
                    if !rv(obj).is_empty() {
                        resource_version = rv(obj).to_string();
                    }
                    let k = key(obj);
                    let fresh = match &ev {
                        WatchEvent::Deleted(_) => seen.remove(&k).is_some(),
                        _ => seen.insert(k, rv(obj).to_string()).as_deref() != Some(rv(obj)),
                    };
                    if fresh {
                        printer.print(std::slice::from_ref(obj))?;
                    }
                }
                Some(Err(e)) if e.is_expired() => {
                    tracing::debug!("watch expired; listing again");
                    let list = api.list(&lp).await?;
                    let changed: Vec<Value> = list
                        .items
                        .iter()
                        .filter(|o| seen.get(&key(o)).map(String::as_str) != Some(rv(o)))
                        .cloned()
                        .collect();
                    printer.print(&changed)?;
                    seen = list
                        .items
                        .iter()
                        .map(|o| (key(o), rv(o).to_string()))
                        .collect();
                    resource_version = list.resource_version;
                    break;
                }
                Some(Err(e)) => return Err(anyhow!(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn several_kinds_prefix_names_and_namespaces_come_first() {
        let layout = Layout {
            kind: "Service",
            wide: false,
            namespace_column: true,
            show_labels: true,
            name_prefix: Some("service/".into()),
        };
        let svc = json!({"metadata": {"name": "web", "namespace": "shop",
            "creationTimestamp": "2024-05-01T11:59:00Z", "labels": {"app": "web"}},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}});
        let lines = layout.table(&[svc], now());
        assert_eq!(
            lines,
            vec![
                "NAMESPACE   NAME          TYPE        CLUSTER-IP   EXTERNAL-IP   PORT(S)   AGE   LABELS",
                "shop        service/web   ClusterIP   10.96.0.1    <none>        80/TCP    60s   app=web",
            ]
        );
    }

    #[test]
    fn no_resources_message() {
        let mut o = GetOpts {
            targets: crate::resources::parse_targets(&["pods".to_string()]).unwrap(),
            label_selector: String::new(),
            field_selector: String::new(),
            output: None,
            watch: false,
            show_labels: false,
            namespace: "shop".into(),
            all_namespaces: false,
        };
        assert_eq!(o.no_resources(), "No resources found in shop namespace.");
        o.all_namespaces = true;
        assert_eq!(o.no_resources(), "No resources found");
        assert_eq!(o.scope(o.targets[0].kind), None);
    }
}
