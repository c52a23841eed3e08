//! Kubernetes' protobuf encoding of objects (`application/vnd.kubernetes.protobuf`), read into
//! the JSON form every request body is decoded from. kubectl's typed commands send it
//! (`kubectl create namespace|deployment|service`, the evictions of `kubectl drain`) and do
//! not fall back to JSON when a server answers 415.
//!
//! The envelope is the four bytes `k8s\0` and a `runtime.Unknown`: its `typeMeta` (apiVersion
//! and kind), and `raw`, the object as a message of its Go type's `generated.proto`. The
//! field numbers and types of those messages come from Kubernetes' .proto files, vendored in
//! `proto/k8s/`, through a generated table (`table.rs`, made by `cargo xtask codegen`; a kind
//! added to [`root_message`] needs its message in the generator's `ROOTS` too). The types with
//! a JSON form of their own are converted as Kubernetes does: `Time` to RFC 3339 (`null` when
//! zero), `IntOrString` to a number or a string, `Quantity` to its string, `FieldsV1` and
//! `RawExtension` to the JSON they carry.
//!
//! Kubernetes writes every non-pointer field, set or not (`generateName: ""`, `hostIPC:
//! false`, `securityContext: {}`): [`decode`] keeps every field Skiff's types have, so an
//! explicit zero (`replicas: 0`) stays, and drops the fields Skiff does not have when they
//! hold their zero value; a field Skiff does not have with a value stays, and the strict
//! decoding that follows names it. No crate reads this format into JSON (the k8s-pb crate has
//! prost structs without serde), so it is read here with prost's wire primitives.

mod order;
mod table;

pub use order::to_json_in_order;

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::Engine as _;
use prost::bytes::Buf;
use prost::encoding::{WireType, decode_key, decode_varint};
use serde_json::{Map, Number, Value};

use crate::schema::{self, Ty as SchemaTy};

/// The content type of the encoding.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8] = b"k8s\0";

/// The wire type of a field, as Kubernetes' generated.proto declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    dead_code,
    reason = "the generator emits Bytes, Duration and Raw for messages outside today's kinds"
)]
enum Ty {
    Str,
    Bytes,
    Bool,
    I32,
    I64,
    F64,
    Msg(&'static str),
    Time,
    Duration,
    IntOrString,
    Quantity,
    FieldsV1,
    Raw,
}

/// One field of a Kubernetes message.
#[derive(Debug, Clone, Copy)]
struct Field {
    num: u32,
    json: &'static str,
    ty: Ty,
    repeated: bool,
    /// `map<string, ty>`, on the wire a repeated entry message {1: key, 2: value}.
    map: bool,
}

fn messages() -> &'static HashMap<&'static str, &'static [Field]> {
    static M: OnceLock<HashMap<&'static str, &'static [Field]>> = OnceLock::new();
    M.get_or_init(|| table::MESSAGES.iter().copied().collect())
}

/// The generated.proto message of `apiVersion` `kind` (`apps/v1` `Deployment` →
/// `api.apps.v1.Deployment`), when Skiff reads it.
fn root_message(api_version: &str, kind: &str) -> Option<&'static str> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let package = match group {
        "" => "api.core",
        "apps" => "api.apps",
        "batch" => "api.batch",
        "policy" => "api.policy",
        "coordination.k8s.io" => "api.coordination",
        "autoscaling" => "api.autoscaling",
        "networking.k8s.io" => "api.networking",
        "storage.k8s.io" => "api.storage",
        "rbac.authorization.k8s.io" => "api.rbac",
        "authorization.k8s.io" => "api.authorization",
        "authentication.k8s.io" => "api.authentication",
        "certificates.k8s.io" => "api.certificates",
        "meta.k8s.io" => "apimachinery.pkg.apis.meta",
        _ => return None,
    };
    let name = format!("{package}.{version}.{kind}");
    // DeleteOptions is sent under every group's version (a typed client's DELETE body).
    let options = format!("apimachinery.pkg.apis.meta.v1.{kind}");
    [name, options]
        .iter()
        .find_map(|n| messages().get_key_value(n.as_str()).map(|(k, _)| *k))
}

/// Reads a Kubernetes protobuf body into the object's JSON (with `apiVersion` and `kind`).
/// Errors say what is wrong in one sentence.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let Some(envelope) = body.strip_prefix(MAGIC) else {
        return Err("a Kubernetes protobuf body starts with the bytes \"k8s\\0\"".into());
    };
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    let mut encoding = String::new();
    let mut buf = envelope;
    while buf.has_remaining() {
        let (num, wire) = key(&mut buf)?;
        match (num, wire) {
            (1, WireType::LengthDelimited) => {
                let mut meta = take(&mut buf)?;
                while meta.has_remaining() {
                    let (n, w) = key(&mut meta)?;
                    match (n, w) {
                        (1, WireType::LengthDelimited) => api_version = string(take(&mut meta)?)?,
                        (2, WireType::LengthDelimited) => kind = string(take(&mut meta)?)?,
                        _ => skip(&mut meta, w)?,
                    }
                }
            }
            (2, WireType::LengthDelimited) => raw = take(&mut buf)?,
            (3, WireType::LengthDelimited) => encoding = string(take(&mut buf)?)?,
            _ => skip(&mut buf, wire)?,
        }
    }
    if !encoding.is_empty() {
        return Err(format!("content encoding {encoding:?} is not supported"));
    }
    if kind.is_empty() {
        return Err("the protobuf envelope names no kind".into());
    }
    let Some(root) = root_message(&api_version, &kind) else {
        return Err(format!(
            "Skiff does not read {api_version} {kind} in protobuf; send it as JSON"
        ));
    };
    let mut obj = message(root, raw)?;
    obj.insert("apiVersion".into(), api_version.into());
    obj.insert("kind".into(), kind.clone().into());
    let mut value = Value::Object(obj);
    prune_unset(Some(&kind), &mut value);
    Ok(value)
}

fn key(buf: &mut &[u8]) -> Result<(u32, WireType), String> {
    decode_key(buf).map_err(|e| format!("malformed protobuf: {e}"))
}

/// A length-delimited value.
fn take<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], String> {
    let len = decode_varint(buf).map_err(|e| format!("malformed protobuf: {e}"))?;
    let len = usize::try_from(len).map_err(|_| "malformed protobuf: a huge length".to_string())?;
    if len > buf.len() {
        return Err("malformed protobuf: a value runs past the end of the body".into());
    }
    let (head, tail) = buf.split_at(len);
    *buf = tail;
    Ok(head)
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    decode_varint(buf).map_err(|e| format!("malformed protobuf: {e}"))
}

fn fixed<const N: usize>(buf: &mut &[u8]) -> Result<[u8; N], String> {
    if buf.len() < N {
        return Err("malformed protobuf: a fixed-size value runs past the end".into());
    }
    let mut out = [0u8; N];
    buf.copy_to_slice(&mut out);
    Ok(out)
}

fn skip(buf: &mut &[u8], wire: WireType) -> Result<(), String> {
    match wire {
        WireType::Varint => varint(buf).map(drop),
        WireType::SixtyFourBit => fixed::<8>(buf).map(drop),
        WireType::ThirtyTwoBit => fixed::<4>(buf).map(drop),
        WireType::LengthDelimited => take(buf).map(drop),
        WireType::StartGroup | WireType::EndGroup => {
            Err("malformed protobuf: groups are not used by Kubernetes".into())
        }
    }
}

fn string(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a protobuf string is not UTF-8".to_string())
}

/// Decodes the message `name` from `bytes`.
fn message(name: &str, mut bytes: &[u8]) -> Result<Map<String, Value>, String> {
    let fields = messages()
        .get(name)
        .ok_or_else(|| format!("no protobuf table for {name}"))?;
    let mut out = Map::new();
    while bytes.has_remaining() {
        let (num, wire) = key(&mut bytes)?;
        let Some(f) = fields.iter().find(|f| f.num == num) else {
            // A field newer than the table: only its zero value can be dropped safely.
            if wire == WireType::LengthDelimited && take(&mut bytes)?.is_empty()
                || wire == WireType::Varint && varint(&mut bytes)? == 0
            {
                continue;
            }
            return Err(format!(
                "field {num} of {} is not known to Skiff; send the object as JSON",
                short(name)
            ));
        };
        if f.map {
            let entry = take(&mut bytes)?;
            let (k, v) = map_entry(f, entry)?;
            let obj = out
                .entry(f.json)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = obj {
                m.insert(k, v);
            }
            continue;
        }
        if f.repeated && wire == WireType::LengthDelimited && is_numeric(f.ty) {
            // Packed scalars.
            let mut packed = take(&mut bytes)?;
            while packed.has_remaining() {
                let v = scalar(f, &mut packed, numeric_wire(f.ty))?;
                push(&mut out, f.json, v);
            }
            continue;
        }
        let v = value(f, &mut bytes, wire)?;
        if f.repeated {
            push(&mut out, f.json, v);
        } else {
            out.insert(f.json.into(), v);
        }
    }
    Ok(out)
}

fn short(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

fn push(out: &mut Map<String, Value>, key: &str, v: Value) {
    let list = out.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(items) = list {
        items.push(v);
    }
}

fn is_numeric(ty: Ty) -> bool {
    matches!(ty, Ty::Bool | Ty::I32 | Ty::I64 | Ty::F64)
}

fn numeric_wire(ty: Ty) -> WireType {
    if ty == Ty::F64 {
        WireType::SixtyFourBit
    } else {
        WireType::Varint
    }
}

fn map_entry(f: &Field, mut entry: &[u8]) -> Result<(String, Value), String> {
    let mut k = String::new();
    let mut v = default_of(f.ty);
    while entry.has_remaining() {
        let (num, wire) = key(&mut entry)?;
        match num {
            1 if wire == WireType::LengthDelimited => k = string(take(&mut entry)?)?,
            2 => v = value(f, &mut entry, wire)?,
            _ => skip(&mut entry, wire)?,
        }
    }
    Ok((k, v))
}

/// The JSON of a type's zero value (a map entry without a value).
fn default_of(ty: Ty) -> Value {
    match ty {
        Ty::Str | Ty::Quantity | Ty::Bytes => Value::String(String::new()),
        Ty::Bool => Value::Bool(false),
        Ty::I32 | Ty::I64 | Ty::IntOrString => Value::from(0),
        Ty::F64 => Value::from(0.0),
        _ => Value::Null,
    }
}

fn scalar(f: &Field, buf: &mut &[u8], wire: WireType) -> Result<Value, String> {
    let bad = || {
        format!(
            "field {} ({}) has wire type {wire:?}, which does not fit its type",
            f.num, f.json
        )
    };
    Ok(match (f.ty, wire) {
        (Ty::Bool, WireType::Varint) => Value::Bool(varint(buf)? != 0),
        // int32 is sign-extended to 64 bits on the wire.
        (Ty::I32, WireType::Varint) => Value::from(varint(buf)? as i64 as i32),
        (Ty::I64, WireType::Varint) => Value::from(varint(buf)? as i64),
        (Ty::F64, WireType::SixtyFourBit) => Number::from_f64(f64::from_le_bytes(fixed::<8>(buf)?))
            .map_or(Value::Null, Value::Number),
        (Ty::F64, WireType::ThirtyTwoBit) => {
            Number::from_f64(f64::from(f32::from_le_bytes(fixed::<4>(buf)?)))
                .map_or(Value::Null, Value::Number)
        }
        _ => return Err(bad()),
    })
}

fn value(f: &Field, buf: &mut &[u8], wire: WireType) -> Result<Value, String> {
    if is_numeric(f.ty) {
        return scalar(f, buf, wire);
    }
    if wire != WireType::LengthDelimited {
        return Err(format!(
            "field {} ({}) has wire type {wire:?}, which does not fit its type",
            f.num, f.json
        ));
    }
    let bytes = take(buf)?;
    Ok(match f.ty {
        Ty::Str => Value::String(string(bytes)?),
        Ty::Bytes => Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        Ty::Msg(name) => Value::Object(message(name, bytes)?),
        Ty::Time => time(bytes)?,
        Ty::Duration => duration(bytes)?,
        Ty::IntOrString => int_or_string(bytes)?,
        Ty::Quantity => first_string(bytes)?.into(),
        Ty::FieldsV1 | Ty::Raw => {
            let raw = first_bytes(bytes)?;
            if raw.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(raw)
                    .map_err(|e| format!("field {} ({}) is not JSON: {e}", f.num, f.json))?
            }
        }
        Ty::Bool | Ty::I32 | Ty::I64 | Ty::F64 => Value::Null,
    })
}

/// Field 1 of a message, as bytes (Quantity's string, FieldsV1's and RawExtension's raw).
fn first_bytes(mut bytes: &[u8]) -> Result<&[u8], String> {
    let mut out: &[u8] = &[];
    while bytes.has_remaining() {
        let (num, wire) = key(&mut bytes)?;
        if num == 1 && wire == WireType::LengthDelimited {
            out = take(&mut bytes)?;
        } else {
            skip(&mut bytes, wire)?;
        }
    }
    Ok(out)
}

fn first_string(bytes: &[u8]) -> Result<String, String> {
    string(first_bytes(bytes)?)
}

/// `Time` {1: seconds, 2: nanos} as RFC 3339 with seconds, `null` when zero.
fn time(mut bytes: &[u8]) -> Result<Value, String> {
    let (mut seconds, mut nanos) = (0i64, 0i64);
    while bytes.has_remaining() {
        let (num, wire) = key(&mut bytes)?;
        match (num, wire) {
            (1, WireType::Varint) => seconds = varint(&mut bytes)? as i64,
            (2, WireType::Varint) => nanos = varint(&mut bytes)? as i64 as i32 as i64,
            _ => skip(&mut bytes, wire)?,
        }
    }
    if seconds == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let t = chrono::DateTime::from_timestamp(seconds, 0)
        .ok_or_else(|| format!("time {seconds} is out of range"))?;
    Ok(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true).into())
}

/// `Duration` {1: nanoseconds} as Go writes a duration (`90s`, `1.5s`).
fn duration(mut bytes: &[u8]) -> Result<Value, String> {
    let mut nanos = 0i64;
    while bytes.has_remaining() {
        let (num, wire) = key(&mut bytes)?;
        match (num, wire) {
            (1, WireType::Varint) => nanos = varint(&mut bytes)? as i64,
            _ => skip(&mut bytes, wire)?,
        }
    }
    let secs = nanos as f64 / 1e9;
    Ok(format!("{secs}s").into())
}

/// `IntOrString` {1: type (0 int, 1 string), 2: intVal, 3: strVal}.
fn int_or_string(mut bytes: &[u8]) -> Result<Value, String> {
    let (mut ty, mut int, mut s) = (0u64, 0i64, String::new());
    while bytes.has_remaining() {
        let (num, wire) = key(&mut bytes)?;
        match (num, wire) {
            (1, WireType::Varint) => ty = varint(&mut bytes)?,
            (2, WireType::Varint) => int = varint(&mut bytes)? as i64 as i32 as i64,
            (3, WireType::LengthDelimited) => s = string(take(&mut bytes)?)?,
            _ => skip(&mut bytes, wire)?,
        }
    }
    Ok(if ty == 1 { s.into() } else { int.into() })
}

/// Whether `v` is a zero value: null, "", 0, false, an empty list or an object of zeros.
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.values().all(is_zero),
    }
}

/// Drops the fields Skiff's type `message` does not have when they hold their zero value,
/// recursively; `None` (a type Skiff does not model, such as `DeleteOptions`) drops every
/// zero field. Fields Skiff has are kept as sent, zeros included.
fn prune_unset(message: Option<&str>, v: &mut Value) {
    let Value::Object(map) = v else { return };
    let msg = message.and_then(schema::message);
    map.retain(|k, val| {
        k == "apiVersion" || k == "kind" || msg.and_then(|m| m.field(k)).is_some() || !is_zero(val)
    });
    for (k, val) in map.iter_mut() {
        let field = msg.and_then(|m| m.field(k));
        let sub = match field.map(|f| f.ty) {
            Some(SchemaTy::Message(n)) => Some(n),
            Some(_) => continue,
            None if msg.is_some() => continue,
            None => None,
        };
        match val {
            Value::Array(items) => items.iter_mut().for_each(|i| prune_unset(sub, i)),
            Value::Object(_) if field.is_some_and(|f| f.map) => {
                if let Value::Object(m) = val {
                    m.values_mut().for_each(|i| prune_unset(sub, i));
                }
            }
            _ => prune_unset(sub, val),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Bodies kubectl 1.32 sent (captured with a loopback listener).
    const NAMESPACE: &[u8] = include_bytes!("testdata/create-namespace.pb");
    const DEPLOYMENT: &[u8] = include_bytes!("testdata/create-deployment.pb");
    const SERVICE: &[u8] = include_bytes!("testdata/create-service.pb");

    #[test]
    fn kubectl_create_namespace() {
        let v = decode(NAMESPACE).unwrap();
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "Namespace");
        assert_eq!(v["metadata"]["name"], "shop");
        // Kubernetes' empty fields that Skiff also has stay as zeros; others go.
        assert!(v["metadata"].get("selfLink").is_none(), "{v}");
        assert!(
            v["metadata"]
                .get("creationTimestamp")
                .is_none_or(Value::is_null)
        );
    }

    #[test]
    fn kubectl_create_deployment_keeps_an_explicit_zero() {
        let v = decode(DEPLOYMENT).unwrap();
        assert_eq!(v["kind"], "Deployment");
        assert_eq!(v["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(v["spec"]["replicas"], 0, "{v}");
        assert_eq!(v["spec"]["selector"]["matchLabels"], json!({"app": "web"}));
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["name"], "nginx");
        assert_eq!(c["image"], "nginx");
        assert_eq!(c["ports"][0]["containerPort"], 80);
        assert!(
            v["spec"]["template"]["spec"].get("hostIPC").is_none(),
            "zeros of fields Skiff lacks are dropped: {v}"
        );
    }

    #[test]
    fn kubectl_create_service_reads_int_or_string() {
        let v = decode(SERVICE).unwrap();
        assert_eq!(v["kind"], "Service");
        let p = &v["spec"]["ports"][0];
        assert_eq!(p["port"], 80);
        assert_eq!(p["targetPort"], 8080);
        assert_eq!(p["name"], "80-8080");
        assert_eq!(v["spec"]["type"], "ClusterIP");
        assert_eq!(v["spec"]["selector"], json!({"app": "web"}));
    }

    /// One length-delimited protobuf field.
    fn ld(num: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![num << 3 | 2];
        prost::encoding::encode_varint(bytes.len() as u64, &mut out);
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn network_policy_keeps_empty_selectors() {
        // Field numbers of Kubernetes' networking/v1 generated.proto.
        let port = [
            ld(1, b"UDP"),
            ld(2, &[0x08, 0x00, 0x10, 53]), // IntOrString{type: Int, intVal: 53}
            vec![3 << 3, 60],               // endPort: 60
        ]
        .concat();
        let labels = ld(1, &[ld(1, b"team"), ld(2, b"a")].concat());
        let peer = [ld(1, b""), ld(2, &labels)].concat();
        let block = ld(3, &[ld(1, b"10.0.0.0/8"), ld(2, b"10.1.0.0/16")].concat());
        let ingress = [ld(1, &port), ld(2, &peer), ld(2, &block)].concat();
        let spec = [ld(1, b""), ld(2, &ingress), ld(4, b"Ingress")].concat();
        let object = [ld(1, &ld(1, b"p")), ld(2, &spec)].concat();
        let envelope = [
            ld(
                1,
                &[ld(1, b"networking.k8s.io/v1"), ld(2, b"NetworkPolicy")].concat(),
            ),
            ld(2, &object),
        ]
        .concat();
        let v = decode(&[MAGIC, envelope.as_slice()].concat()).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "p"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{
                    "ports": [{"protocol": "UDP", "port": 53, "endPort": 60}],
                    "from": [{"podSelector": {}, "namespaceSelector": {"matchLabels": {"team": "a"}}},
                             {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                }]},
            })
        );
    }

    #[test]
    fn storage_kinds_are_read() {
        // Field numbers of Kubernetes' storage/v1 and core/v1 generated.proto.
        let entry = ld(3, &[ld(1, b"type"), ld(2, b"ssd")].concat());
        let class = [
            ld(1, &ld(1, b"fast")),
            ld(2, b"skiff.io/local-path"),
            entry,
            ld(4, b"Retain"),
            vec![6 << 3, 1], // allowVolumeExpansion: true
            ld(7, b"WaitForFirstConsumer"),
        ]
        .concat();
        let envelope = [
            ld(
                1,
                &[ld(1, b"storage.k8s.io/v1"), ld(2, b"StorageClass")].concat(),
            ),
            ld(2, &class),
        ]
        .concat();
        let v = decode(&[MAGIC, envelope.as_slice()].concat()).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "fast"}, "provisioner": "skiff.io/local-path",
                "parameters": {"type": "ssd"}, "reclaimPolicy": "Retain",
                "allowVolumeExpansion": true, "volumeBindingMode": "WaitForFirstConsumer",
            })
        );
        // A claim: an explicit empty storageClassName (no class) stays, a Quantity is its
        // string.
        let requests = ld(2, &[ld(1, b"storage"), ld(2, &ld(1, b"1Gi"))].concat());
        let spec = [ld(1, b"ReadWriteOnce"), ld(2, &requests), ld(5, b"")].concat();
        let envelope = [
            ld(1, &[ld(1, b"v1"), ld(2, b"PersistentVolumeClaim")].concat()),
            ld(2, &[ld(1, &ld(1, b"data")), ld(2, &spec)].concat()),
        ]
        .concat();
        let v = decode(&[MAGIC, envelope.as_slice()].concat()).unwrap();
        assert_eq!(
            v["spec"],
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                   "resources": {"requests": {"storage": "1Gi"}}})
        );
    }

    #[test]
    fn bad_bodies_are_one_sentence() {
        assert!(decode(b"{}").unwrap_err().contains("k8s\\0"));
        assert!(decode(b"k8s\0\x0a\x05").unwrap_err().contains("malformed"));
        // Truncated anywhere: an error, never a panic.
        for end in 0..DEPLOYMENT.len() {
            let _ = decode(&DEPLOYMENT[..end]);
        }
        // A kind Skiff does not read in protobuf.
        let mut other = NAMESPACE.to_vec();
        let at = other.windows(9).position(|w| w == b"Namespace").unwrap();
        other[at..at + 9].copy_from_slice(b"Component");
        assert_eq!(
            decode(&other).unwrap_err(),
            "Skiff does not read v1 Component in protobuf; send it as JSON"
        );
    }

    #[test]
    fn a_set_field_skiff_lacks_is_kept_for_the_strict_decoder_to_name() {
        // PodSpec field 13 is hostIPC: true.
        let pod_spec = messages()["api.core.v1.PodSpec"];
        let host_ipc = pod_spec.iter().find(|f| f.json == "hostIPC").unwrap();
        assert_eq!(host_ipc.num, 13);
        let mut v = json!({"kind": "Pod", "spec": {"hostIPC": true, "hostPID": false}});
        prune_unset(Some("Pod"), &mut v);
        assert_eq!(v["spec"]["hostIPC"], true);
        assert_eq!(
            v["spec"]["hostPID"], false,
            "a field Skiff has keeps its zero"
        );
    }

    #[test]
    fn every_message_the_table_names_is_in_it() {
        for (name, fields) in table::MESSAGES {
            for f in *fields {
                if let Ty::Msg(m) = f.ty {
                    assert!(messages().contains_key(m), "{name}.{} names {m}", f.json);
                }
            }
        }
    }
}
