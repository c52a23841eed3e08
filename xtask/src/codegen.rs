//! `cargo xtask codegen`: generates `proto/src/k8s_wire/table.rs`, the field numbers and types
//! of the Kubernetes protobuf messages Skiff reads (`application/vnd.kubernetes.protobuf`
//! request bodies), from Kubernetes' `generated.proto` files vendored in `proto/k8s/` (origin,
//! version and hashes in `proto/k8s/README.md` and `SHA256SUMS`).
//!
//! The table holds the messages reachable from [`ROOTS`] (the kinds `k8s_wire::root_message`
//! maps to), sorted by name, each with its fields in the order the file declares them (the
//! Go struct's order, which is Kubernetes' JSON field order too), one line per field. Types
//! with a JSON form of their own ([`SPECIAL`]) are leaves, not followed into their fields.
//!
//! The `.proto` files are read by a small parser here, for the subset go-to-protobuf writes:
//! `syntax`, `package`, `import`, `option`, `message` (nested too), fields with `optional`,
//! `required` or `repeated`, and `map<string, T>`. Anything else (`enum`, `oneof`, field
//! options, ...) is an error naming the file and line, not something skipped. No crate does
//! this without a native tool: `prost-build`, the only protobuf crate in Cargo.lock that reads
//! `.proto` text, runs `protoc`, and xtask must build before `cargo xtask setup` installs it.
//!
//! The test `table_is_fresh` fails when the checked-in table is not what this generates.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};

use crate::util::repo_root;

/// The vendored `.proto` files, relative to the repository root.
const INPUTS: &str = "proto/k8s";
/// The generated table, relative to the repository root.
const TABLE: &str = "proto/src/k8s_wire/table.rs";

/// The messages Skiff reads as protobuf: every message they reach goes into the table.
const ROOTS: &[&str] = &[
    "api.apps.v1.DaemonSet",
    "api.apps.v1.Deployment",
    "api.apps.v1.ReplicaSet",
    "api.apps.v1.StatefulSet",
    "api.authentication.v1.SelfSubjectReview",
    "api.authentication.v1.TokenRequest",
    "api.authorization.v1.LocalSubjectAccessReview",
    "api.authorization.v1.SelfSubjectAccessReview",
    "api.authorization.v1.SubjectAccessReview",
    "api.autoscaling.v1.Scale",
    "api.autoscaling.v2.HorizontalPodAutoscaler",
    "api.batch.v1.CronJob",
    "api.batch.v1.Job",
    "api.certificates.v1.CertificateSigningRequest",
    "api.coordination.v1.Lease",
    "api.core.v1.Binding",
    "api.core.v1.ConfigMap",
    "api.core.v1.Endpoints",
    "api.core.v1.Event",
    "api.core.v1.Namespace",
    "api.core.v1.Node",
    "api.core.v1.PersistentVolume",
    "api.core.v1.PersistentVolumeClaim",
    "api.core.v1.Pod",
    "api.core.v1.ReplicationController",
    "api.core.v1.Secret",
    "api.core.v1.Service",
    "api.core.v1.ServiceAccount",
    "api.networking.v1.NetworkPolicy",
    "api.policy.v1.Eviction",
    "api.policy.v1.PodDisruptionBudget",
    "api.rbac.v1.ClusterRole",
    "api.rbac.v1.ClusterRoleBinding",
    "api.rbac.v1.Role",
    "api.rbac.v1.RoleBinding",
    "api.storage.v1.StorageClass",
    "apimachinery.pkg.apis.meta.v1.DeleteOptions",
    // Not read as protobuf: their field order is how answers are written.
    "apimachinery.pkg.apis.meta.v1.ListMeta",
    "apimachinery.pkg.apis.meta.v1.PartialObjectMetadata",
    "apimachinery.pkg.apis.meta.v1.PartialObjectMetadataList",
    "apimachinery.pkg.apis.meta.v1.Status",
];

/// Messages with a JSON form of their own (not an object of their fields), and their `Ty`.
const SPECIAL: &[(&str, &str)] = &[
    ("apimachinery.pkg.api.resource.Quantity", "Quantity"),
    ("apimachinery.pkg.apis.meta.v1.Duration", "Duration"),
    ("apimachinery.pkg.apis.meta.v1.FieldsV1", "FieldsV1"),
    ("apimachinery.pkg.apis.meta.v1.MicroTime", "Time"),
    ("apimachinery.pkg.apis.meta.v1.Time", "Time"),
    ("apimachinery.pkg.runtime.RawExtension", "Raw"),
    ("apimachinery.pkg.util.intstr.IntOrString", "IntOrString"),
];

/// Protobuf scalar types and their `Ty` (`float` is read as either width).
const SCALARS: &[(&str, &str)] = &[
    ("bool", "Bool"),
    ("bytes", "Bytes"),
    ("double", "F64"),
    ("float", "F64"),
    ("int32", "I32"),
    ("int64", "I64"),
    ("string", "Str"),
];

/// Scalar types `k8s_wire::Ty` has no variant for: a field of one is an error.
const UNSUPPORTED_SCALARS: &[&str] = &[
    "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64",
];

/// Regenerates the table; writes it only when it changed.
pub fn run() -> Result<()> {
    let root = repo_root();
    let table = generate(&root.join(INPUTS))?;
    let path = root.join(TABLE);
    let old = fs::read_to_string(&path).unwrap_or_default();
    if old == table {
        println!("{TABLE}: up to date");
        return Ok(());
    }
    fs::write(&path, &table).with_context(|| format!("writing {}", path.display()))?;
    println!("{TABLE}: written ({} lines)", table.lines().count());
    Ok(())
}

/// The table generated from the `.proto` files under `dir`.
fn generate(dir: &Path) -> Result<String> {
    let mut messages = BTreeMap::new();
    for file in proto_files(dir)? {
        let src =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let name = file
            .strip_prefix(dir)
            .unwrap_or(&file)
            .display()
            .to_string();
        parse_file(&name, &src, &mut messages)?;
    }
    render(&messages)
}

/// Every `.proto` file under `dir`, sorted.
fn proto_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "proto") {
                files.push(path);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("no .proto files under {}", dir.display());
    }
    Ok(files)
}

/// One field as declared: its type is resolved only for the messages the table holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawField {
    num: u32,
    name: String,
    /// The type as written (`string`, `ObjectMeta`, `.apimachinery.pkg.apis.meta.v1.Time`).
    ty: String,
    repeated: bool,
    /// `map<string, ty>`.
    map: bool,
    /// Where the file declares it, for errors.
    at: String,
}

/// Messages by full name (`api.core.v1.Pod`, nested ones `pkg.Outer.Inner`).
type Messages = BTreeMap<String, Vec<RawField>>;

/// The closure of [`ROOTS`], rendered as the Rust source of `table.rs`.
fn render(messages: &Messages) -> Result<String> {
    let mut todo: Vec<String> = ROOTS.iter().map(|r| (*r).to_owned()).collect();
    let mut seen = BTreeSet::new();
    while let Some(m) = todo.pop() {
        if seen.contains(&m) || SPECIAL.iter().any(|(s, _)| *s == m) {
            continue;
        }
        let fields = messages
            .get(&m)
            .ok_or_else(|| anyhow!("message {m} is not defined in {INPUTS}"))?;
        for f in fields {
            if let Ty::Msg(t) = resolve(messages, &m, f)? {
                todo.push(t);
            }
        }
        seen.insert(m);
    }

    let mut out = String::from(HEADER);
    out.push_str("pub(super) static MESSAGES: &[(&str, &[Field])] = &[\n");
    for m in &seen {
        let fields = messages.get(m).cloned().unwrap_or_default();
        let _ = writeln!(out, "    ({m:?}, &[");
        for f in &fields {
            let ty = match resolve(messages, m, f)? {
                Ty::Leaf(v) => format!("Ty::{v}"),
                Ty::Msg(t) => format!("Ty::Msg({t:?})"),
            };
            let _ = writeln!(
                out,
                "        Field {{ num: {}, json: {:?}, ty: {ty}, repeated: {}, map: {} }},",
                f.num, f.name, f.repeated, f.map
            );
        }
        out.push_str("    ]),\n");
    }
    out.push_str("];\n");
    Ok(out)
}

const HEADER: &str = "\
// Generated by `cargo xtask codegen` (xtask/src/codegen.rs) from Kubernetes' generated.proto
// files vendored in proto/k8s/ (k8s.io/api and k8s.io/apimachinery; origin, version and
// SHA-256 of each in proto/k8s/README.md and proto/k8s/SHA256SUMS). Do not edit by hand:
// change the inputs or the generator and run `cargo xtask codegen`; xtask's test
// `codegen::tests::table_is_fresh` fails when this file is not what they generate.
// Field numbers are the Kubernetes protobuf wire format; they never change between
// Kubernetes versions, so kubectl 1.32 writes the same ones.

use super::{Field, Ty};

#[rustfmt::skip]
";

/// A resolved field type.
#[derive(Debug, PartialEq, Eq)]
enum Ty {
    /// A `k8s_wire::Ty` variant without a payload (a scalar or a [`SPECIAL`] type).
    Leaf(&'static str),
    /// A message the table holds, by full name.
    Msg(String),
}

/// The type of `field` of message `scope`, resolved as protoc does: a name with a leading dot
/// is fully qualified, any other is looked up in the innermost enclosing scope first.
fn resolve(messages: &Messages, scope: &str, field: &RawField) -> Result<Ty> {
    let name = field.ty.as_str();
    if let Some((_, v)) = SCALARS.iter().find(|(s, _)| *s == name) {
        return Ok(Ty::Leaf(v));
    }
    if UNSUPPORTED_SCALARS.contains(&name) {
        bail!(
            "{}: field {} has type {name}, which k8s_wire::Ty cannot hold",
            field.at,
            field.name
        );
    }
    let full = if let Some(abs) = name.strip_prefix('.') {
        messages.contains_key(abs).then(|| abs.to_owned())
    } else {
        let mut prefix = scope;
        loop {
            let candidate = format!("{prefix}.{name}");
            if messages.contains_key(&candidate) {
                break Some(candidate);
            }
            match prefix.rsplit_once('.') {
                Some((outer, _)) => prefix = outer,
                None => break messages.contains_key(name).then(|| name.to_owned()),
            }
        }
    };
    let full = full.ok_or_else(|| {
        anyhow!(
            "{}: type {name} of field {} is not defined in {INPUTS}",
            field.at,
            field.name
        )
    })?;
    Ok(match SPECIAL.iter().find(|(s, _)| *s == full) {
        Some((_, v)) => Ty::Leaf(v),
        None => Ty::Msg(full),
    })
}

/// Adds the messages of one `.proto` file (`name` is for errors) to `messages`.
fn parse_file(name: &str, src: &str, messages: &mut Messages) -> Result<()> {
    let mut p = Parser {
        file: name,
        toks: lex(name, src)?,
        pos: 0,
    };
    let mut package = String::new();
    while let Some(tok) = p.next_opt() {
        match tok {
            Tok::Sym(';') => {}
            Tok::Word(w) if w == "syntax" => {
                p.sym('=')?;
                let s = p.string()?;
                if s != "proto2" && s != "proto3" {
                    return Err(p.err(&format!("unknown syntax {s:?}")));
                }
                p.sym(';')?;
            }
            Tok::Word(w) if w == "package" => {
                package = p.word()?;
                p.sym(';')?;
            }
            Tok::Word(w) if w == "import" => {
                p.string()?;
                p.sym(';')?;
            }
            Tok::Word(w) if w == "option" => p.option()?,
            Tok::Word(w) if w == "message" => p.message(&package, messages)?,
            other => return Err(p.err(&format!("unsupported {other} at the top level"))),
        }
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// An identifier or a dotted name (`.apimachinery.pkg.apis.meta.v1.Time`).
    Word(String),
    Int(u32),
    Str(String),
    Sym(char),
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Word(w) => write!(f, "`{w}`"),
            Tok::Int(n) => write!(f, "`{n}`"),
            Tok::Str(s) => write!(f, "{s:?}"),
            Tok::Sym(c) => write!(f, "`{c}`"),
        }
    }
}

/// The tokens of `src` with their line numbers; comments and whitespace dropped.
fn lex(file: &str, src: &str) -> Result<Vec<(Tok, usize)>> {
    let mut toks = Vec::new();
    let mut chars = src.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '/' if chars.peek() == Some(&'/') => while chars.next_if(|&c| c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let start = line;
                let mut prev = ' ';
                loop {
                    match chars.next() {
                        Some('/') if prev == '*' => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            prev = c;
                        }
                        None => bail!("{file}:{start}: unterminated /* comment"),
                    }
                }
            }
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => s.extend(chars.next()),
                        Some('\n') | None => bail!("{file}:{line}: unterminated string"),
                        Some(c) => s.push(c),
                    }
                }
                toks.push((Tok::Str(s), line));
            }
            c if c.is_ascii_digit() => {
                let mut s = String::from(c);
                while let Some(d) = chars.next_if(char::is_ascii_alphanumeric) {
                    s.push(d);
                }
                let n = s
                    .parse()
                    .map_err(|_| anyhow!("{file}:{line}: bad number {s:?}"))?;
                toks.push((Tok::Int(n), line));
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == '.' => {
                let mut s = String::from(c);
                while let Some(d) =
                    chars.next_if(|&d| d.is_ascii_alphanumeric() || d == '_' || d == '.')
                {
                    s.push(d);
                }
                toks.push((Tok::Word(s), line));
            }
            '{' | '}' | '<' | '>' | '=' | ';' | ',' | '[' | ']' | '(' | ')' | '-' => {
                toks.push((Tok::Sym(c), line));
            }
            c => bail!("{file}:{line}: unexpected character {c:?}"),
        }
    }
    Ok(toks)
}

struct Parser<'a> {
    file: &'a str,
    toks: Vec<(Tok, usize)>,
    pos: usize,
}

impl Parser<'_> {
    fn next_opt(&mut self) -> Option<Tok> {
        let tok = self.toks.get(self.pos).map(|(t, _)| t.clone());
        self.pos += 1;
        tok
    }

    fn next(&mut self) -> Result<Tok> {
        self.next_opt()
            .ok_or_else(|| anyhow!("{}: unexpected end of file", self.file))
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    /// `file:line` of the last token read.
    fn at(&self) -> String {
        let line = self
            .toks
            .get(self.pos.saturating_sub(1))
            .map_or(0, |(_, l)| *l);
        format!("{}:{line}", self.file)
    }

    /// An error at the last token read.
    fn err(&self, msg: &str) -> anyhow::Error {
        anyhow!("{}: {msg}", self.at())
    }

    fn sym(&mut self, c: char) -> Result<()> {
        match self.next()? {
            Tok::Sym(s) if s == c => Ok(()),
            other => Err(self.err(&format!("expected `{c}`, found {other}"))),
        }
    }

    fn word(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Word(w) => Ok(w),
            other => Err(self.err(&format!("expected a name, found {other}"))),
        }
    }

    fn string(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Str(s) => Ok(s),
            other => Err(self.err(&format!("expected a string, found {other}"))),
        }
    }

    fn int(&mut self) -> Result<u32> {
        match self.next()? {
            Tok::Int(n) => Ok(n),
            other => Err(self.err(&format!("expected a number, found {other}"))),
        }
    }

    /// `option NAME = VALUE;` after `option`; its value is not used.
    fn option(&mut self) -> Result<()> {
        self.word()?;
        self.sym('=')?;
        match self.next()? {
            Tok::Word(_) | Tok::Int(_) | Tok::Str(_) => self.sym(';'),
            other => Err(self.err(&format!("unsupported option value {other}"))),
        }
    }

    /// `NAME { ... }` after `message`, in `scope` (the package or the enclosing message).
    fn message(&mut self, scope: &str, messages: &mut Messages) -> Result<()> {
        let name = self.word()?;
        if name.contains('.') {
            return Err(self.err(&format!("bad message name {name:?}")));
        }
        let full = if scope.is_empty() {
            name
        } else {
            format!("{scope}.{name}")
        };
        if messages.contains_key(&full) {
            return Err(self.err(&format!("message {full} is defined twice")));
        }
        messages.insert(full.clone(), Vec::new());
        self.sym('{')?;
        let mut fields: Vec<RawField> = Vec::new();
        loop {
            let tok = self.next()?;
            let at = self.at();
            let field = match tok {
                Tok::Sym('}') => break,
                Tok::Sym(';') => continue,
                Tok::Word(w) if w == "message" => {
                    self.message(&full, messages)?;
                    continue;
                }
                Tok::Word(w) if w == "option" => {
                    self.option()?;
                    continue;
                }
                Tok::Word(w) if w == "map" => {
                    self.sym('<')?;
                    let key = self.word()?;
                    if key != "string" {
                        return Err(self.err(&format!(
                            "map key type {key}: k8s_wire reads only map<string, T>"
                        )));
                    }
                    self.sym(',')?;
                    let ty = self.word()?;
                    self.sym('>')?;
                    self.field_rest(ty, false, true, at)?
                }
                Tok::Word(w) if w == "repeated" => {
                    let ty = self.word()?;
                    self.field_rest(ty, true, false, at)?
                }
                Tok::Word(w) if w == "optional" || w == "required" => {
                    let ty = self.word()?;
                    self.field_rest(ty, false, false, at)?
                }
                Tok::Word(w)
                    if ["enum", "oneof", "extend", "extensions", "reserved", "group"]
                        .contains(&w.as_str()) =>
                {
                    return Err(self.err(&format!("`{w}` is not supported by the generator")));
                }
                // A proto3 field without a label.
                Tok::Word(ty) if matches!(self.peek(), Some(Tok::Word(_))) => {
                    self.field_rest(ty, false, false, at)?
                }
                other => return Err(self.err(&format!("unsupported {other} in message {full}"))),
            };
            if fields.iter().any(|f| f.num == field.num) {
                return Err(self.err(&format!("field number {} used twice in {full}", field.num)));
            }
            if fields.iter().any(|f| f.name == field.name) {
                return Err(self.err(&format!("field name {} used twice in {full}", field.name)));
            }
            fields.push(field);
        }
        messages.insert(full, fields);
        Ok(())
    }

    /// `NAME = NUMBER;` after a field's type.
    fn field_rest(
        &mut self,
        ty: String,
        repeated: bool,
        map: bool,
        at: String,
    ) -> Result<RawField> {
        let name = self.word()?;
        if name.contains('.') {
            return Err(self.err(&format!("bad field name {name:?}")));
        }
        self.sym('=')?;
        let num = self.int()?;
        if num == 0 {
            return Err(self.err("field number 0"));
        }
        match self.next()? {
            Tok::Sym(';') => {}
            Tok::Sym('[') => {
                return Err(self.err("field options are not supported by the generator"));
            }
            other => return Err(self.err(&format!("expected `;`, found {other}"))),
        }
        Ok(RawField {
            num,
            name,
            ty,
            repeated,
            map,
            at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Result<Messages> {
        let mut m = Messages::new();
        parse_file("t.proto", src, &mut m)?;
        Ok(m)
    }

    /// Fields of `msg` as (num, name, ty, repeated, map).
    fn fields(m: &Messages, msg: &str) -> Vec<(u32, String, Ty, bool, bool)> {
        m[msg]
            .iter()
            .map(|f| {
                let ty = resolve(m, msg, f).expect("resolves");
                (f.num, f.name.clone(), ty, f.repeated, f.map)
            })
            .collect()
    }

    #[test]
    fn table_is_fresh() {
        let root = repo_root();
        let want = generate(&root.join(INPUTS)).expect("the vendored .proto files generate");
        let have = fs::read_to_string(root.join(TABLE)).expect("the table is readable");
        if have != want {
            let same = have.lines().zip(want.lines()).take_while(|(a, b)| a == b);
            let line = same.count() + 1;
            panic!(
                "{TABLE} is not what {INPUTS} generates (first difference at line {line}): \
                 run cargo xtask codegen"
            );
        }
    }

    #[test]
    fn inputs_match_manifest() {
        use sha2::{Digest, Sha256};
        let dir = repo_root().join(INPUTS);
        let manifest = fs::read_to_string(dir.join("SHA256SUMS")).expect("SHA256SUMS");
        let mut listed = BTreeMap::new();
        for line in manifest.lines() {
            let (hash, path) = line.split_once("  ").expect("`HASH  PATH` lines");
            listed.insert(path.to_owned(), hash.to_owned());
        }
        let present: BTreeMap<String, String> = proto_files(&dir)
            .expect("proto files")
            .into_iter()
            .map(|p| {
                let bytes = fs::read(&p).expect("readable");
                let hash: String = Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let rel = p
                    .strip_prefix(&dir)
                    .expect("under dir")
                    .display()
                    .to_string();
                (rel, hash)
            })
            .collect();
        let wrong: Vec<&String> = listed
            .keys()
            .chain(present.keys())
            .filter(|f| listed.get(*f) != present.get(*f))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert!(
            wrong.is_empty(),
            "{INPUTS}/SHA256SUMS must list every vendored .proto file with its SHA-256; \
             missing, extra or changed: {wrong:?}"
        );
    }

    #[test]
    fn parses_the_subset() {
        let m = parse(
            r#"
            /* licence
               text */
            syntax = "proto2";
            package api.x.v1;
            import "apimachinery/pkg/apis/meta/v1/generated.proto";
            option go_package = "k8s.io/api/x/v1";
            // A message.
            message Thing {
              // +optional
              optional .api.x.v1.Thing.Inner.Deep meta = 1;
              repeated string names = 3;
              map<string, Other> others = 2;
              message Inner {
                message Deep {
                  optional int64 n = 1;
                }
                optional Deep deep = 1;
              }
              optional Inner inner = 4;
              bytes raw = 5;
            }
            message Other {
              optional bool on = 1;
            }
            message Empty {
            }
            "#,
        )
        .expect("parses");
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            [
                "api.x.v1.Empty",
                "api.x.v1.Other",
                "api.x.v1.Thing",
                "api.x.v1.Thing.Inner",
                "api.x.v1.Thing.Inner.Deep"
            ]
        );
        let msg = |s: &str| Ty::Msg(s.to_owned());
        assert_eq!(
            fields(&m, "api.x.v1.Thing"),
            [
                (
                    1,
                    "meta".into(),
                    msg("api.x.v1.Thing.Inner.Deep"),
                    false,
                    false
                ),
                (3, "names".into(), Ty::Leaf("Str"), true, false),
                (2, "others".into(), msg("api.x.v1.Other"), false, true),
                (4, "inner".into(), msg("api.x.v1.Thing.Inner"), false, false),
                (5, "raw".into(), Ty::Leaf("Bytes"), false, false),
            ]
        );
        // `Deep` inside `Inner` resolves in `Inner`'s scope first.
        assert_eq!(
            fields(&m, "api.x.v1.Thing.Inner"),
            [(
                1,
                "deep".into(),
                msg("api.x.v1.Thing.Inner.Deep"),
                false,
                false
            )]
        );
    }

    #[test]
    fn inner_scope_shadows_outer() {
        let m = parse(
            "package p;
             message Spec { optional string s = 1; }
             message Pod {
               message Spec { optional bool b = 1; }
               optional Spec spec = 1;
               optional .p.Spec outer = 2;
             }",
        )
        .expect("parses");
        assert_eq!(
            fields(&m, "p.Pod"),
            [
                (1, "spec".into(), Ty::Msg("p.Pod.Spec".into()), false, false),
                (2, "outer".into(), Ty::Msg("p.Spec".into()), false, false),
            ]
        );
    }

    #[test]
    fn special_types_are_leaves() {
        let m = parse(
            "package apimachinery.pkg.apis.meta.v1;
             message Time { optional int64 seconds = 1; }
             message ObjectMeta { optional Time creationTimestamp = 8; }",
        )
        .expect("parses");
        assert_eq!(
            fields(&m, "apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            [(
                8,
                "creationTimestamp".into(),
                Ty::Leaf("Time"),
                false,
                false
            )]
        );
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        for (src, want) in [
            ("package p; enum E { A = 0; }", "unsupported `enum`"),
            (
                "package p; message M { enum E { A = 0; } }",
                "`enum` is not supported",
            ),
            (
                "package p; message M { oneof o { string a = 1; } }",
                "`oneof` is not supported",
            ),
            (
                "package p; message M { optional string a = 1 [default = \"x\"]; }",
                "field options",
            ),
            (
                "package p; message M { map<int32, string> a = 1; }",
                "map key type int32",
            ),
            (
                "package p; message M { optional string a = 1; optional bool b = 1; }",
                "used twice",
            ),
            ("package p; message M {} message M {}", "defined twice"),
            (
                "package p; message M { optional string a = 1;",
                "end of file",
            ),
            ("package p; /* open", "unterminated"),
        ] {
            let err = parse(src).expect_err(src).to_string();
            assert!(err.contains(want), "{src}: {err}");
        }
    }

    #[test]
    fn unknown_and_unsupported_types_fail() {
        let m = parse(
            "package p;
             message A { optional Missing x = 1; }
             message B { optional uint32 y = 1; }",
        )
        .expect("parses");
        let err = resolve(&m, "p.A", &m["p.A"][0])
            .expect_err("unknown")
            .to_string();
        assert!(
            err.contains("t.proto:2: type Missing of field x is not defined"),
            "{err}"
        );
        let err = resolve(&m, "p.B", &m["p.B"][0])
            .expect_err("uint32")
            .to_string();
        assert!(err.contains("uint32"), "{err}");
    }

    #[test]
    fn errors_name_file_and_line() {
        let err = parse("package p;\n\nmessage M {\n  optional string a = x;\n}")
            .expect_err("bad number")
            .to_string();
        assert!(err.starts_with("t.proto:4: expected a number"), "{err}");
    }
}
