//! Behaviour tests: each asserts Kubernetes' exact message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use crate::{ListType, Schema};

const P: &str = "spec.versions[0].schema.openAPIV3Schema";

fn with_spec(spec: Value) -> Value {
    json!({"type": "object", "properties": {"spec": spec}})
}

fn spec_props(props: Value) -> Value {
    with_spec(json!({"type": "object", "properties": props}))
}

fn schema(raw: Value) -> Schema {
    match Schema::new(&raw, P) {
        Ok(s) => s,
        Err(errs) => panic!(
            "schema refused: {:#?}",
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        ),
    }
}

fn schema_errors(raw: Value) -> Vec<String> {
    match Schema::new(&raw, P) {
        Ok(_) => Vec::new(),
        Err(errs) => errs.iter().map(|e| e.to_string()).collect(),
    }
}

fn errors(s: &Schema, obj: Value) -> Vec<String> {
    s.validate(&obj, None)
        .iter()
        .map(|e| e.to_string())
        .collect()
}

fn obj(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec})
}

#[test]
fn value_validation_messages() {
    let s = schema(spec_props(json!({
        "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 0.5, "multipleOf": 0.25},
        "name": {"type": "string", "maxLength": 3, "minLength": 2, "pattern": "^a"},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "list": {"type": "array", "maxItems": 2, "minItems": 1, "items": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 2},
        "port": {"x-kubernetes-int-or-string": true},
        "opt": {"type": "string", "nullable": true},
        "req": {"type": "string"},
        "ip": {"type": "string", "format": "ipv4"},
        "when": {"type": "string", "format": "date-time"},
    })));
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"replicas": "x"}),
            r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#,
        ),
        (
            json!({"replicas": 11}),
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
        ),
        (
            json!({"replicas": 0}),
            "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
        ),
        (
            json!({"replicas": 2.5}),
            r#"spec.replicas: Invalid value: "number": spec.replicas in body must be of type integer: "number""#,
        ),
        (
            json!({"ratio": 0.5}),
            "spec.ratio: Invalid value: 0.5: spec.ratio in body should be less than 0.5",
        ),
        (
            json!({"ratio": 0.3}),
            "spec.ratio: Invalid value: 0.3: spec.ratio in body should be a multiple of 0.25",
        ),
        (
            json!({"name": "abcd"}),
            "spec.name: Too long: may not be longer than 3",
        ),
        (
            json!({"name": "a"}),
            r#"spec.name: Invalid value: "a": spec.name in body should be at least 2 chars long"#,
        ),
        (
            json!({"name": "xy"}),
            r#"spec.name: Invalid value: "xy": spec.name in body should match '^a'"#,
        ),
        (
            json!({"mode": "c"}),
            r#"spec.mode: Unsupported value: "c": supported values: "a", "b""#,
        ),
        (
            json!({"list": ["a", "b", "c"]}),
            "spec.list: Too many: 3: must have at most 2 items",
        ),
        (
            json!({"list": []}),
            "spec.list: Invalid value: 0: spec.list in body should have at least 1 items",
        ),
        (
            json!({"list": [1]}),
            r#"spec.list[0]: Invalid value: "integer": spec.list[0] in body must be of type string: "integer""#,
        ),
        (
            json!({"labels": {"a": 1}}),
            r#"spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type string: "integer""#,
        ),
        (
            json!({"labels": {"a": "1", "b": "2", "c": "3"}}),
            "spec.labels: Too many: 3: must have at most 2 items",
        ),
        (
            json!({"port": true}),
            r#"spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#,
        ),
        (
            json!({"req": null}),
            r#"spec.req: Invalid value: "null": spec.req in body must be of type string: "null""#,
        ),
        (
            json!({"ip": "abc"}),
            r#"spec.ip: Invalid value: "abc": spec.ip in body must be of type ipv4: "abc""#,
        ),
        (
            json!({"when": "yesterday"}),
            r#"spec.when: Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday""#,
        ),
        (
            json!("x"),
            r#"spec: Invalid value: "string": spec in body must be of type object: "string""#,
        ),
    ];
    for (spec, want) in cases {
        assert_eq!(
            errors(&s, obj(spec.clone())),
            vec![want.to_string()],
            "for {spec}"
        );
    }
    // Valid values pass, including int-or-string both ways, null when nullable,
    // a float that is an integer, and a unicode string counted in characters.
    for spec in [
        json!({"port": 80}),
        json!({"port": "http"}),
        json!({"opt": null}),
        json!({"replicas": 3.0}),
        json!({"name": "aé"}),
        json!({"ratio": 0.25}),
        json!({"ip": "10.1.2.3", "when": "2024-01-02T03:04:05Z"}),
    ] {
        assert_eq!(
            errors(&s, obj(spec.clone())),
            Vec::<String>::new(),
            "for {spec}"
        );
    }
}

#[test]
fn required_and_root_fields() {
    let mut raw = spec_props(json!({"name": {"type": "string"}}));
    raw["properties"]["spec"]["required"] = json!(["name"]);
    raw["required"] = json!(["spec"]);
    let s = schema(raw);
    assert_eq!(
        errors(&s, obj(json!({}))),
        vec!["spec.name: Required value"]
    );
    assert_eq!(
        errors(
            &s,
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {}})
        ),
        vec!["spec: Required value"]
    );
}

#[test]
fn metadata_name_restrictions_apply() {
    let s = schema(json!({
        "type": "object",
        "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}}}
    }));
    let o = json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "toolong", "labels": {"x": "y"}}});
    assert_eq!(
        errors(&s, o),
        vec!["metadata.name: Too long: may not be longer than 3"]
    );
}

#[test]
fn composite_errors_are_reported_at_the_root() {
    let s = schema(with_spec(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}]
    })));
    assert_eq!(
        errors(&s, obj(json!({}))),
        vec![
            r#"<nil>: Invalid value: "": "spec" must validate one and only one schema (oneOf). Found none valid"#,
            "spec.a: Required value"
        ]
    );
    assert_eq!(errors(&s, obj(json!({"a": "x"}))), Vec::<String>::new());
}

#[test]
fn list_types_reject_duplicates() {
    let s = schema(spec_props(json!({
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "ports": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}
        }
    })));
    assert_eq!(
        errors(&s, obj(json!({"tags": ["a", "b", "a"]}))),
        vec![r#"spec.tags[2]: Duplicate value: "a""#]
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]}))
        ),
        vec![r#"spec.ports[1]: Duplicate value: map[string]interface {}{"name":"a"}"#]
    );
    assert_eq!(
        s.list_type(&["spec", "ports"]),
        Some(ListType::Map(vec!["name".into()]))
    );
    assert_eq!(s.list_type(&["spec", "tags"]), Some(ListType::Set));
    assert_eq!(s.list_type(&["spec", "nope"]), None);
    assert_eq!(s.type_at(&["spec", "ports"]), Some("array"));
    assert_eq!(s.type_at(&["spec"]), Some("object"));
    assert_eq!(s.type_at(&["spec", "missing"]), None);
}

#[test]
fn embedded_resources_need_api_version_and_kind() {
    let s = schema(spec_props(json!({
        "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}
    })));
    assert_eq!(
        errors(&s, obj(json!({"template": {"metadata": {}}}))),
        vec![
            "spec.template.apiVersion: Required value: must not be empty",
            "spec.template.kind: Required value: must not be empty"
        ]
    );
    assert_eq!(
        errors(
            &s,
            obj(json!({"template": {"apiVersion": "v1", "kind": "Pod"}}))
        ),
        Vec::<String>::new()
    );
}

#[test]
fn structural_violations_are_refused() {
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            spec_props(json!({"a": {"description": "no type"}})),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].type: Required value: must not be empty for specified object fields",
            ],
        ),
        (
            with_spec(json!({"$ref": "#/definitions/x", "type": "object"})),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].$ref: Forbidden: $ref is not supported",
            ],
        ),
        (
            with_spec(
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
            ),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
            ],
        ),
        (
            spec_props(
                json!({"l": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}),
            ),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
            ],
        ),
        (
            json!({"type": "string"}),
            vec![
                r#"spec.versions[0].schema.openAPIV3Schema.type: Invalid value: "string": must be object at the root"#,
            ],
        ),
        (
            spec_props(
                json!({"a": {"type": "string", "anyOf": [{"type": "string", "maxLength": 3}]}}),
            ),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].anyOf[0].type: Forbidden: must be empty to be structural",
            ],
        ),
        (
            spec_props(
                json!({"a": {"type": "object", "anyOf": [{"properties": {"b": {"maxLength": 3}}}]}}),
            ),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].properties[b]: Required value: because it is defined in spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].anyOf[0].properties[b]",
            ],
        ),
        (
            spec_props(json!({"l": {"type": "array"}})),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].items: Required value: must be specified",
            ],
        ),
        (
            spec_props(
                json!({"l": {"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}),
            ),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map",
            ],
        ),
        (
            spec_props(
                json!({"l": {"type": "array", "x-kubernetes-list-type": "bag", "items": {"type": "string"}}}),
            ),
            vec![
                r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", "set", "map""#,
            ],
        ),
        (
            json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
            ],
        ),
        (
            spec_props(json!({"a": {"type": "string", "bogus": 1}})),
            vec![
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].bogus: Forbidden: unknown field",
            ],
        ),
        (
            spec_props(json!({"a": {"type": "integer", "default": "x"}})),
            vec![
                r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].default: Invalid value: "string":  in body must be of type integer: "string""#,
            ],
        ),
        (
            spec_props(
                json!({"a": {"type": "object", "properties": {"b": {"type": "string"}}, "default": {"b": "x", "c": 1}}}),
            ),
            vec![
                r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].default: Invalid value: map[string]interface {}{"b":"x", "c":1}: must not have unknown fields"#,
            ],
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(schema_errors(raw.clone()), want, "for {raw}");
    }
}

#[test]
fn hostile_schemas_and_objects_are_bounded() {
    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "object", "properties": {"a": deep}});
    }
    let errs = schema_errors(deep);
    assert!(
        errs.iter()
            .any(|e| e.contains("schema nesting exceeds the maximum depth of 64")),
        "{errs:?}"
    );

    let s = schema(with_spec(
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
    ));
    let mut v = json!(1);
    for _ in 0..1000 {
        v = json!({"a": v});
    }
    assert_eq!(
        errors(&s, obj(v)),
        vec![r#"<nil>: Invalid value: "object": object nesting exceeds the maximum depth of 128"#]
    );
}

fn with_rules(spec_schema: Value) -> Schema {
    schema(with_spec(spec_schema))
}

#[test]
fn cel_rules() {
    let s = with_rules(json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "name": {"type": "string"}},
        "x-kubernetes-validations": [
            {"rule": "self.a <= self.b", "message": "a must not exceed b"},
            {"rule": "!has(self.name) || self.name.startsWith('x')"},
            {"rule": "self.a != 7", "messageExpression": "'a is ' + string(self.a)"},
            {"rule": "self.b != 99", "fieldPath": ".b", "reason": "FieldValueForbidden", "message": "not 99"}
        ]
    }));
    assert_eq!(
        errors(&s, obj(json!({"a": 1, "b": 2, "name": "xy"}))),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"a": 3, "b": 2}))),
        vec![r#"spec: Invalid value: "object": a must not exceed b"#]
    );
    assert_eq!(
        errors(&s, obj(json!({"a": 1, "b": 2, "name": "y"}))),
        vec![
            r#"spec: Invalid value: "object": failed rule: !has(self.name) || self.name.startsWith('x')"#
        ]
    );
    assert_eq!(
        errors(&s, obj(json!({"a": 7, "b": 8}))),
        vec![r#"spec: Invalid value: "object": a is 7"#]
    );
    assert_eq!(
        errors(&s, obj(json!({"a": 1, "b": 99}))),
        vec!["spec.b: Forbidden: not 99"]
    );
    // A missing field is an evaluation error, as in Kubernetes.
    assert_eq!(
        errors(&s, obj(json!({"b": 1}))),
        vec![
            r#"spec: Invalid value: "object": no such key: a evaluating rule: a must not exceed b"#,
            r#"spec: Invalid value: "object": no such key: a evaluating rule: self.a != 7"#
        ]
    );
}

#[test]
fn cel_rule_at_the_root_and_on_items() {
    let s = schema(json!({
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name.size() < 5", "message": "short names only"}],
        "properties": {"spec": {"type": "object", "properties": {"items": {
            "type": "array",
            "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self.size() > 1"}]}
        }}}}
    }));
    let o = json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "toolong"}, "spec": {"items": ["ab", "c"]}});
    assert_eq!(
        errors(&s, o),
        vec![
            r#"<nil>: Invalid value: "object": short names only"#,
            r#"spec.items[1]: Invalid value: "string": failed rule: self.size() > 1"#
        ]
    );
}

#[test]
fn cel_transition_rules() {
    let s = with_rules(json!({
        "type": "object",
        "properties": {"immutable": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "Value is immutable"}]}}
    }));
    let new = obj(json!({"immutable": "b"}));
    let old = obj(json!({"immutable": "a"}));
    // Create: no old value, the transition rule does not run.
    assert_eq!(s.validate(&new, None), vec![]);
    let errs: Vec<String> = s
        .validate(&new, Some(&old))
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        errs,
        vec![r#"spec.immutable: Invalid value: "string": Value is immutable"#]
    );
    assert!(s.validate(&old, Some(&old)).is_empty());
}

#[test]
fn cel_rules_that_do_not_compile_are_refused() {
    let errs = schema_errors(with_spec(
        json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a ==="}]}),
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with(r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: apiextensions.ValidationRule{Rule:"self.a ===", Message:"", MessageExpression:"", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:"", OptionalOldSelf:(*bool)(nil)}: compilation failed: ERROR: <input>:1:"#),
        "{errs:?}"
    );
    let errs = schema_errors(with_spec(
        json!({"type": "object", "x-kubernetes-validations": [{"rule": "other > 1"}]}),
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].ends_with("compilation failed: ERROR: <input>:1:1: undeclared reference to 'other' (in container '')"), "{errs:?}");
    let errs = schema_errors(spec_props(
        json!({"l": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}),
    ));
    assert_eq!(
        errs,
        vec![
            r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].items.x-kubernetes-validations[0].rule: Invalid value: "self == oldSelf": oldSelf cannot be used on the uncorrelatable portion of the schema within spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l]"#
        ]
    );
    let errs = schema_errors(with_spec(
        json!({"type": "object", "x-kubernetes-validations": [{"rule": ""}]}),
    ));
    assert_eq!(
        errs,
        vec![
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Required value: rule is not specified"
        ]
    );
    let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
    let errs = schema_errors(with_spec(
        json!({"type": "object", "x-kubernetes-validations": [{"rule": deep}]}),
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
}

#[test]
fn costly_cel_rules_are_cut_by_the_budget() {
    let rule = "self.l.all(x, self.l.all(y, self.l.all(z, x + y + z >= 0)))";
    let s = with_rules(json!({
        "type": "object",
        "properties": {"l": {"type": "array", "items": {"type": "integer"}}},
        "x-kubernetes-validations": [{"rule": rule}]
    }));
    let small: Vec<i64> = (0..5).collect();
    assert_eq!(errors(&s, obj(json!({"l": small}))), Vec::<String>::new());
    let big: Vec<i64> = (0..300).collect();
    let start = std::time::Instant::now();
    assert_eq!(
        errors(&s, obj(json!({"l": big}))),
        vec![format!(
            "spec: Invalid value: \"object\": 'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {rule}"
        )]
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn defaulting_nested_and_nullable() {
    let s = schema(spec_props(json!({
        "replicas": {"type": "integer", "default": 1},
        "opt": {"type": "string", "nullable": true, "default": "d"},
        "strict": {"type": "string", "default": "s"},
        "nested": {"type": "object", "default": {}, "properties": {"x": {"type": "string", "default": "dx"}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"p": {"type": "integer", "default": 80}}}},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "default": "v"}}
    })));
    let mut o =
        obj(json!({"opt": null, "strict": null, "items": [{}, {"p": 1}], "labels": {"a": null}}));
    s.apply_defaults(&mut o);
    assert_eq!(
        o["spec"],
        json!({"replicas": 1, "opt": null, "strict": "s", "nested": {"x": "dx"}, "items": [{"p": 80}, {"p": 1}], "labels": {"a": "v"}})
    );
    // Nothing to default where the parent is absent and has no default.
    let s2 = schema(spec_props(
        json!({"o": {"type": "object", "properties": {"x": {"type": "string", "default": "d"}}}}),
    ));
    let mut o2 = obj(json!({}));
    s2.apply_defaults(&mut o2);
    assert_eq!(o2["spec"], json!({}));
}

#[test]
fn pruning() {
    let s = schema(json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "keep": {"type": "string"},
                "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"typed": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object", "properties": {"c": {"type": "string"}}}}}
            }}
        }
    }));
    let mut o = json!({
        "apiVersion": "a/v1", "kind": "K", "metadata": {"name": "n", "bogus": 1},
        "status": {"x": 1},
        "spec": {
            "keep": "k", "foo": 1,
            "items": [{"a": "x", "bar": 2}],
            "free": {"anything": {"deep": true}, "typed": {"x": "1", "y": "2"}},
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "junk": 1}, "spec": {"c": "c", "d": "d"}, "other": 1}
        }
    });
    let removed = s.prune(&mut o);
    assert_eq!(
        removed,
        vec![
            "metadata.bogus",
            "spec.foo",
            "spec.free.typed.y",
            "spec.items[0].bar",
            "spec.template.metadata.junk",
            "spec.template.other",
            "spec.template.spec.d",
            "status"
        ]
    );
    assert_eq!(
        o,
        json!({
            "apiVersion": "a/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {
                "keep": "k",
                "items": [{"a": "x"}],
                "free": {"anything": {"deep": true}, "typed": {"x": "1"}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"c": "c"}}
            }
        })
    );
}

#[test]
fn openapi_round_trips_the_schema() {
    let raw = spec_props(
        json!({"a": {"type": "string", "x-kubernetes-validations": [{"rule": "self != ''"}]}}),
    );
    assert_eq!(schema(raw.clone()).openapi(), raw);
}

#[test]
fn schema_is_send_and_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Schema>();
}

#[test]
fn cel_macros_survive_the_cost_rewrite() {
    let rules = [
        "self.l.map(x, x * 2).filter(y, y > 2).size() == 2",
        "self.l.exists_one(x, x == 1)",
        "self.m.all(k, self.m[k] > 0)",
        "has(self.m.a) && !has(self.m.z)",
        "self.s.lowerAscii() == 'abc'",
        "self.l.exists(x, x == 3) && [1, 2].all(x, x in self.l)",
    ];
    let specs: Vec<Value> = rules.iter().map(|r| json!({"rule": r})).collect();
    let s = with_rules(json!({
        "type": "object",
        "properties": {
            "l": {"type": "array", "items": {"type": "integer"}},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
            "s": {"type": "string"}
        },
        "x-kubernetes-validations": specs
    }));
    assert_eq!(
        errors(
            &s,
            obj(json!({"l": [1, 2, 3], "m": {"a": 1, "b": 2}, "s": "ABC"}))
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"l": [1, 2, 3], "m": {"a": 0}, "s": "ABC"}))).len(),
        1
    );
}

#[test]
fn cel_optional_old_self() {
    let s = with_rules(json!({
        "type": "object",
        "properties": {"v": {"type": "integer", "x-kubernetes-validations": [
            {"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "optionalOldSelf": true, "message": "may not decrease"}
        ]}}
    }));
    assert!(s.validate(&obj(json!({"v": 1})), None).is_empty());
    let errs: Vec<String> = s
        .validate(&obj(json!({"v": 1})), Some(&obj(json!({"v": 2}))))
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        errs,
        vec![r#"spec.v: Invalid value: "integer": may not decrease"#]
    );
}

/// An object given as its fields and its metadata apart is validated as the
/// assembled object is: metadata's name rules, root property counts,
/// required fields, forbidden properties, and CEL rules reading the metadata.
#[test]
fn objects_given_in_parts_are_validated_as_whole_ones() {
    let name_rule =
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}});
    let schemas = [
        json!({"type": "object", "properties": {"metadata": name_rule, "spec": {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}}}}),
        json!({"type": "object", "maxProperties": 3, "properties": {"metadata": name_rule, "spec": {"type": "object"}}}),
        json!({"type": "object", "minProperties": 5, "properties": {"spec": {"type": "object"}}}),
        json!({"type": "object", "required": ["spec", "metadata"], "properties": {"spec": {"type": "object"}}}),
        json!({"type": "object", "properties": {"spec": {"type": "object"}},
               "x-kubernetes-validations": [{"rule": "self.metadata.name.size() < 5", "message": "short names only"}]}),
        json!({"type": "object", "anyOf": [{"required": ["spec"]}], "properties": {"spec": {"type": "object"}}}),
    ];
    let objects = [
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "toolong"}, "spec": {}}),
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "ok"}, "spec": {"a": "x"}}),
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {}}),
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"generateName": "g-"}, "spec": {"a": 1}, "extra": 2}),
    ];
    let mut failing = 0;
    for raw in &schemas {
        let s = schema(raw.clone());
        for o in &objects {
            let whole: Vec<String> = s.validate(o, None).iter().map(|e| e.to_string()).collect();
            let mut fields = o.clone();
            let meta = fields.as_object_mut().unwrap().remove("metadata").unwrap();
            let parts: Vec<String> = s
                .validate_parts(&fields, &meta, None)
                .iter()
                .map(|e| e.to_string())
                .collect();
            assert_eq!(parts, whole, "schema {raw}, object {o}");
            failing += usize::from(!whole.is_empty());
        }
    }
    // The cases exercise refusals, not only clean objects.
    assert!(failing >= 8, "only {failing} refusals");
}
