//! Tool schemas every client accepts. schemars writes Rust's integer widths as `format`s
//! (`uint64`, `int32`, …) and an `Option` as a `["integer", "null"]` type array or an
//! `anyOf` with `{"type": "null"}`; the TypeScript SDK warns on every call about the
//! formats, and some model APIs reject both. [`portable`] rewrites a schema without them
//! (an optional field is simply not `required`), and [`drop_nulls`] removes the `null`
//! fields from a structured result so that it still matches the rewritten schema.

use serde_json::{Map, Value};

/// Number formats that are not JSON Schema's own (`minimum: 0` keeps what `uint*` said).
fn numeric_format(f: &str) -> Option<bool> {
    match f {
        "uint" | "uint8" | "uint16" | "uint32" | "uint64" | "uint128" => Some(true),
        "int" | "int8" | "int16" | "int32" | "int64" | "int128" | "float" | "double" => Some(false),
        _ => None,
    }
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
}

/// Rewrite one schema object in place; true when it allowed `null` before.
fn rewrite(obj: &mut Map<String, Value>) -> bool {
    let mut nullable = false;
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        let before = types.len();
        types.retain(|t| t.as_str() != Some("null"));
        nullable |= types.len() != before;
        if types.len() == 1 {
            let only = types.remove(0);
            obj.insert("type".into(), only);
        }
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(alts)) = obj.get_mut(key) else {
            continue;
        };
        let before = alts.len();
        alts.retain(|a| !is_null_schema(a));
        nullable |= alts.len() != before;
        if alts.len() == 1
            && let Some(Value::Object(only)) = alts.pop()
        {
            obj.remove(key);
            for (k, v) in only {
                obj.entry(k).or_insert(v);
            }
        }
    }
    if obj.get("default").is_some_and(Value::is_null) {
        obj.remove("default");
    }
    if let Some(unsigned) = obj
        .get("format")
        .and_then(Value::as_str)
        .and_then(numeric_format)
    {
        obj.remove("format");
        if unsigned && !obj.contains_key("minimum") {
            obj.insert("minimum".into(), Value::from(0));
        }
    }
    // Properties that allowed null are optional now: absent instead of null.
    let mut optional: Vec<String> = Vec::new();
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for (name, p) in props.iter_mut() {
            if let Value::Object(p) = p
                && rewrite(p)
            {
                optional.push(name.clone());
            }
        }
    }
    if let Some(Value::Array(required)) = obj.get_mut("required") {
        required.retain(|r| !r.as_str().is_some_and(|r| optional.iter().any(|o| o == r)));
    }
    for (key, v) in obj.iter_mut() {
        if key == "properties" {
            continue;
        }
        walk(v);
    }
    nullable
}

/// Every schema below `v` (definitions, items, alternatives, …).
fn walk(v: &mut Value) {
    match v {
        Value::Object(o) => {
            rewrite(o);
        }
        Value::Array(a) => a.iter_mut().for_each(walk),
        _ => {}
    }
}

/// A tool's input or output schema without integer-width formats and nullable types.
pub(super) fn portable(schema: &mut Map<String, Value>) {
    rewrite(schema);
}

/// A structured result without `null` fields, at any depth (they are optional fields that
/// are absent, which is what [`portable`] schemas say).
pub(super) fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.retain(|_, x| !x.is_null());
            o.values_mut().for_each(drop_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What a client may warn about or reject, anywhere in a schema: a number `format` or a
    /// type that allows `null`. Empty when the schema is portable.
    pub(super) fn non_portable(v: &Value) -> Vec<String> {
        let mut found = Vec::new();
        fn go(v: &Value, path: &str, found: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    if let Some(f) = o.get("format").and_then(Value::as_str)
                        && numeric_format(f).is_some()
                    {
                        found.push(format!("{path}: format {f}"));
                    }
                    match o.get("type") {
                        Some(Value::Array(_)) => found.push(format!("{path}: type array")),
                        Some(Value::String(t)) if t == "null" => {
                            found.push(format!("{path}: type null"))
                        }
                        _ => {}
                    }
                    for (k, x) in o {
                        // `properties` and `$defs` hold names, not keywords.
                        go(x, &format!("{path}/{k}"), found);
                    }
                }
                Value::Array(a) => {
                    for (i, x) in a.iter().enumerate() {
                        go(x, &format!("{path}/{i}"), found);
                    }
                }
                _ => {}
            }
        }
        go(v, "#", &mut found);
        found
    }

    #[test]
    fn formats_and_nullable_types_are_rewritten() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "format": "uint64", "minimum": 0},
                "code": {"type": ["integer", "null"], "format": "int32"},
                "err": {"anyOf": [{"$ref": "#/$defs/E"}, {"type": "null"}],
                        "description": "d"},
                "x": {"type": "number", "format": "double"},
                "when": {"type": "string", "format": "date-time"}
            },
            "required": ["n", "code", "err"],
            "$defs": {"E": {"type": "object", "properties": {
                "w": {"type": "integer", "format": "uint32"},
                "u": {"type": ["string", "null"], "default": null}
            }, "required": ["u"]}}
        });
        let Value::Object(o) = &mut s else { panic!() };
        portable(o);
        assert_eq!(
            s,
            json!({
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 0},
                    "code": {"type": "integer"},
                    "err": {"$ref": "#/$defs/E", "description": "d"},
                    "x": {"type": "number"},
                    "when": {"type": "string", "format": "date-time"}
                },
                "required": ["n"],
                "$defs": {"E": {"type": "object", "properties": {
                    "w": {"type": "integer", "minimum": 0},
                    "u": {"type": "string"}
                }, "required": []}}
            })
        );
        assert!(non_portable(&s).is_empty(), "{:?}", non_portable(&s));
    }

    #[test]
    fn non_portable_finds_what_clients_reject() {
        let s = json!({"properties": {"a": {"type": ["integer", "null"]},
                                      "b": {"items": {"format": "uint32"}}}});
        assert_eq!(
            non_portable(&s),
            vec![
                "#/properties/a: type array".to_string(),
                "#/properties/b/items: format uint32".to_string()
            ]
        );
    }

    #[test]
    fn nulls_are_dropped_at_any_depth() {
        let mut v = json!({"a": null, "b": 1, "c": [{"d": null, "e": "x"}], "f": {"g": null}});
        drop_nulls(&mut v);
        assert_eq!(v, json!({"b": 1, "c": [{"e": "x"}], "f": {}}));
    }
}
