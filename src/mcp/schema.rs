//! The tools' input and output schemas, generated once with schemars settings that every
//! client accepts: no `$schema` line, no `$ref` (some model APIs cannot follow one), no
//! number `format`s (`uint64`, `int32`: the TypeScript SDK warns about them on every call),
//! and no `null` alternative for an optional field (some model APIs reject a type array or
//! `anyOf` with `null`): an optional field is one that is not `required`, and the result
//! types skip `None` when serialized (`skip_serializing_if`), so they never send `null`.
//!
//! An output schema says each field's type (and an enum's values), not the inside of nested
//! objects, which fields are always there, nor descriptions: clients use it to check a
//! result's types, and an agent reads the text and the results themselves. That keeps `tools/list`, which every connection pays for,
//! small.

use std::sync::Arc;

use rmcp::model::JsonObject;
use schemars::generate::SchemaSettings;
use schemars::transform::{RecursiveTransform, RestrictFormats};
use schemars::{JsonSchema, Schema};
use serde_json::Value;

fn settings() -> SchemaSettings {
    let mut formats = RestrictFormats::default();
    // With no `$schema` to read the draft from, only these are kept: none are.
    formats.infer_from_meta_schema = false;
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .with_transform(RecursiveTransform(no_null))
        .with_transform(formats)
}

/// An `Option`'s `null` alternative left out (schemars has no setting for it), and defaults
/// that say no more than "optional" (`null`, an empty list or map).
fn no_null(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t.as_str() != Some("null"));
        if let [only] = types.as_slice() {
            let only = only.clone();
            obj.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(alts)) = obj.get_mut("anyOf") {
        alts.retain(|a| a.get("type").and_then(Value::as_str) != Some("null"));
        if let [Value::Object(_)] = alts.as_slice()
            && let Some(Value::Array(mut alts)) = obj.remove("anyOf")
            && let Some(Value::Object(only)) = alts.pop()
        {
            for (k, v) in only {
                obj.entry(k).or_insert(v);
            }
        }
    }
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    if obj.get("default").is_some_and(empty) {
        obj.remove("default");
    }
}

fn object(schema: Schema) -> Arc<JsonObject> {
    match schema.to_value() {
        Value::Object(mut o) => {
            // The type's own name and documentation: noise beside the tool's description.
            o.remove("title");
            o.remove("description");
            Arc::new(o)
        }
        _ => Arc::new(JsonObject::new()),
    }
}

/// The input schema of a tool whose parameters are `T` (what `T` accepts).
pub(super) fn input<T: JsonSchema>() -> Arc<JsonObject> {
    object(settings().into_generator().into_root_schema_for::<T>())
}

/// The output schema of a tool whose structured result is `T` (what `T` writes), its
/// fields' types only.
pub(super) fn output<T: JsonSchema>() -> Arc<JsonObject> {
    let settings = settings().for_serialize().with_transform(fields_only);
    object(settings.into_generator().into_root_schema_for::<T>())
}

/// The top-level fields with their types: nested objects as `{"type": "object"}`, and no
/// `required` list (which fields a result has is the result's to say).
fn fields_only(schema: &mut Schema) {
    schema.remove("required");
    let Some(Value::Object(props)) = schema.get_mut("properties") else {
        return;
    };
    for p in props.values_mut() {
        *p = field(p);
    }
}

/// A field's type (an array's items are the result's to say, as a nested object's fields).
fn field(p: &Value) -> Value {
    let mut out = JsonObject::new();
    // An enum's values say its type.
    let keys: &[&str] = match p.get("enum") {
        Some(_) => &["enum"],
        None => &["type", "const"],
    };
    for &key in keys {
        if let Some(v) = p.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(Value::Array(alts)) = p.get("oneOf") {
        out.insert("oneOf".into(), alts.iter().map(field).collect());
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct In {
        /// The count.
        n: u64,
        #[serde(default)]
        names: Vec<String>,
        #[serde(default)]
        code: Option<i32>,
        #[serde(default)]
        inner: Option<Inner>,
    }

    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Inner {
        /// Width.
        w: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        u: Option<String>,
    }

    #[derive(Serialize, JsonSchema)]
    #[allow(dead_code)]
    enum Kind {
        A,
        B,
    }

    #[derive(Serialize, JsonSchema)]
    struct Out {
        kind: Kind,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        list: Vec<Inner>,
        #[serde(skip_serializing_if = "Option::is_none")]
        inner: Option<Inner>,
    }

    #[test]
    fn inputs_have_no_formats_nulls_or_refs() {
        assert_eq!(
            Value::Object((*input::<In>()).clone()),
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "n": {"type": "integer", "minimum": 0, "description": "The count."},
                    "names": {"type": "array", "items": {"type": "string"}},
                    "code": {"type": "integer"},
                    "inner": {"type": "object", "properties": {
                        "w": {"type": "integer", "minimum": 0, "description": "Width."},
                        "u": {"type": "string"}
                    }, "required": ["w"]}
                },
                "required": ["n"]
            })
        );
    }

    #[test]
    fn outputs_give_the_fields_types() {
        assert_eq!(
            Value::Object((*output::<Out>()).clone()),
            json!({
                "type": "object",
                "properties": {
                    "kind": {"enum": ["A", "B"]},
                    "code": {"type": "integer"},
                    "list": {"type": "array"},
                    "inner": {"type": "object"}
                }
            })
        );
        // What such a result is, serialized: no nulls.
        let v = serde_json::to_value(Out {
            kind: Kind::A,
            code: None,
            list: vec![Inner { w: 1, u: None }],
            inner: None,
        })
        .unwrap();
        assert_eq!(v, json!({"kind": "A", "list": [{"w": 1}]}));
    }
}
