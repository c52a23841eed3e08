//! The REST API's request decoders on arbitrary input, for `cargo fuzz`
//! (`tests/fuzz`, target `rest_decoders`) and a unit test: paths, query
//! parameters (selectors, continue tokens, dryRun, fieldValidation, list and watch options),
//! Accept headers, bodies in JSON, YAML and Kubernetes protobuf strictly decoded as each kind,
//! the three patch types applied to a live object, server-side apply onto an object two
//! managers own, and port forwarding's SPDY frames. None of them may panic, whatever the bytes; everything they refuse is an
//! `ApiError` (a 4xx). No store is involved.

use axum::http::{HeaderMap, HeaderValue, header};
use serde_json::{Value, json};
use skiff_api::kinds;

use super::call::{FieldValidation, dry_run, encode_with, parse_body};
use super::objects::{decode_continue, validate_list_options};
use super::patch::{PatchType, apply};
use super::query::Query;
use super::{managed, path};
use crate::status::negotiate;

/// Runs one decoder, chosen by the first byte, on the rest of `data`.
pub fn decode_request(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 8 {
        0 => {
            let _ = path::parse(&text);
        }
        1 => query(&text),
        2 => {
            if let Ok(v) = HeaderValue::from_bytes(rest) {
                let mut h = HeaderMap::new();
                h.insert(header::ACCEPT, v);
                let _ = negotiate(&h);
            }
        }
        3 => body(rest, "application/json"),
        4 => body(rest, "application/yaml"),
        5 => patch(rest),
        6 => body(rest, skiff_api::k8s_wire::CONTENT_TYPE),
        _ => spdy_session(rest),
    }
}

fn query(text: &str) {
    let q = Query::parse(Some(text));
    let _ = FieldValidation::parse(&q);
    let _ = dry_run(q.get("dryRun"));
    let _ = validate_list_options(&q);
    let _ = super::watch::send_initial_events(&q);
    if let Some(c) = q.get("continue") {
        let _ = decode_continue(c);
    }
    if let Some(s) = q.get("labelSelector") {
        let _ = skiff_api::selector::Selector::parse(s);
    }
    if let Some(s) = q.get("fieldSelector") {
        let _ = skiff_api::selector::FieldSelector::parse(s);
    }
    let _ = q.all("command");
    let _ = q.flag("watch");
}

fn body(bytes: &[u8], content_type: &'static str) {
    let mut h = HeaderMap::new();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let Ok(value) = parse_body(&h, bytes) else {
        return;
    };
    for kind in kinds() {
        for mode in [
            FieldValidation::Strict,
            FieldValidation::Warn,
            FieldValidation::Ignore,
        ] {
            let _ = encode_with(*kind, value.clone(), mode);
        }
    }
}

/// A live Deployment the patches are applied to.
fn live() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [
                                  {"name": "app", "image": "host",
                                   "env": [{"name": "A", "value": "1"}],
                                   "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}
    })
}

fn patch(bytes: &[u8]) {
    let Ok(p) = serde_json::from_slice::<Value>(bytes) else {
        return;
    };
    let original = live();
    let Some(deployments) = kinds().iter().find(|k| k.info().kind == "Deployment") else {
        return;
    };
    for ty in [PatchType::Json, PatchType::Merge, PatchType::Strategic] {
        if let Ok(mut patched) = apply("Deployment", &original, &p, ty) {
            managed::record_update("Deployment", Some(&original), &mut patched, WRITER);
            let _ = encode_with(*deployments, patched, FieldValidation::Strict);
        }
    }
    // Server-side apply of the bytes as an applied configuration, onto a live object that
    // an earlier apply and an update own parts of, with and without force.
    let Ok(mut owned) = managed::apply("Deployment", None, &original, WRITER, false) else {
        return;
    };
    let mut scaled = owned.clone();
    scaled["spec"]["replicas"] = json!(5);
    managed::record_update(
        "Deployment",
        Some(&owned),
        &mut scaled,
        managed::Writer {
            manager: "scaler",
            ..WRITER
        },
    );
    owned = scaled;
    for force in [false, true] {
        if let Ok(applied) = managed::apply("Deployment", Some(&owned), &p, WRITER, force) {
            let _ = encode_with(*deployments, applied, FieldValidation::Strict);
        }
    }
}

/// Port forwarding's SPDY frames as a client may send them, cut at every length.
fn spdy_session(bytes: &[u8]) {
    let mut reader = super::spdy::Reader::new();
    for chunk in bytes.chunks(7) {
        reader.push(chunk);
        while let Ok(Some(_)) = reader.next() {}
    }
}

const WRITER: managed::Writer<'static> = managed::Writer {
    manager: "fuzz",
    api_version: "apps/v1",
    time: "2026-01-01T00:00:00Z",
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The corpus seeds the fuzzer starts from run here on every test.
    #[test]
    fn seeds_decode_without_panicking() {
        let seeds: [&[u8]; 12] = [
            b"\x00/apis/apps/v1/namespaces/default/deployments/web/scale",
            b"\x00/api/v1/namespaces//pods/%2F/log",
            b"\x01labelSelector=a%20in%20(x,y),!b&fieldSelector=status.phase!%3DRunning&continue=eyJydiI6MX0&dryRun=All",
            b"\x02application/json;as=Table;v=v1;g=meta.k8s.io, */*;q=0.1",
            b"\x03{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\",\"metadata\":{\"name\":\"x\"},\"spec\":{\"replicas\":\"3\"}}",
            b"\x03[1,2,{\"a\":null}]",
            b"\x04kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: host, resources: {limits: {cpu: 1}}}]\n",
            b"\x05[{\"op\":\"move\",\"from\":\"/spec\",\"path\":\"/spec/x\"}]",
            b"\x05{\"spec\":{\"template\":{\"spec\":{\"containers\":[{\"name\":\"app\",\"$patch\":\"delete\"}]}}}}",
            b"\x05{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\",\"metadata\":{\"name\":\"web\",\"managedFields\":[{\"manager\":\"x\",\"fieldsV1\":{\"f:spec\":{\"k:{\\\"name\\\":1}\":{\".\":{}}}}}]},\"spec\":{\"replicas\":3}}",
            b"\x05{\"spec\":{\"template\":{\"spec\":{\"containers\":[{\"name\":\"app\"},{\"image\":\"no-name\"}]}}}}",
            b"\x05{\"spec\":{\"template\":{\"spec\":{\"$setElementOrder/containers\":[{\"name\":\"x\"}],\"containers\":[{\"name\":\"x\",\"image\":\"y\"}]}}}}",
        ];
        for s in seeds {
            decode_request(s);
        }
        for pb in std::fs::read_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fuzz/seeds/rest_decoders"
        ))
        .into_iter()
        .flatten()
        .flatten()
        {
            if let Ok(bytes) = std::fs::read(pb.path()) {
                decode_request(&bytes);
            }
        }
    }
}
