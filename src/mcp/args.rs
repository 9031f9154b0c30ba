//! Arguments checked against the tool's input schema before the call, so that a mistaken
//! call is told which field is wrong, what it expects and what a good call looks like (the
//! bare deserializer says "missing field `code`" at best, and nothing about where a wrong
//! type was). Only the mistakes are looked at: a call that passes goes on unchanged.

use rmcp::model::JsonObject;
use serde_json::Value;

use crate::error::ToolError;
use crate::lang::did_you_mean;

/// A good call of each of the server's tools.
fn example(tool: &str, schema: &JsonObject) -> String {
    let known = match tool {
        "run-code" => r#"{"languageId": "python", "code": "print(1 + 1)"}"#,
        "session_start" => {
            r#"{"language": "python", "files": [{"name": "data.csv", "content": "a,b\n1,2\n"}]}"#
        }
        "session_eval" => r#"{"session_id": "<id from session_start>", "code": "x = 1"}"#,
        "session_input" => r#"{"session_id": "<id from session_start>", "text": "42"}"#,
        "session_interrupt" | "session_close" => r#"{"session_id": "<id from session_start>"}"#,
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    // Any other tool: its required fields with a value of their type.
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let props = schema.get("properties").and_then(Value::as_object);
    let mut ex = serde_json::Map::new();
    for name in required.iter().filter_map(Value::as_str) {
        let p = props.and_then(|p| p.get(name)).unwrap_or(&Value::Null);
        let v = match p.get("type").and_then(Value::as_str) {
            Some("integer") | Some("number") => Value::from(1),
            Some("boolean") => Value::from(true),
            Some("array") => Value::Array(Vec::new()),
            Some("object") => Value::Object(Default::default()),
            _ => Value::from("…"),
        };
        ex.insert(name.to_string(), v);
    }
    Value::Object(ex).to_string()
}

/// What a property schema asks for, in words.
fn expected(p: &Value, defs: Option<&JsonObject>) -> String {
    let p = resolve(p, defs);
    match p.get("type").and_then(Value::as_str) {
        Some("string") => "a string".into(),
        Some("integer") if p.get("minimum").and_then(Value::as_f64) == Some(0.0) => {
            "a whole number, 0 or more".into()
        }
        Some("integer") => "a whole number".into(),
        Some("number") => "a number".into(),
        Some("boolean") => "true or false".into(),
        Some("array") => match p.get("items") {
            Some(items) => {
                let items = resolve(items, defs);
                match items.get("properties").and_then(Value::as_object) {
                    Some(props) => format!(
                        "an array of objects with {}",
                        props
                            .keys()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => format!("an array of {}s", plural_base(&expected(items, defs))),
                }
            }
            None => "an array".into(),
        },
        Some("object") => match (p.get("properties"), p.get("additionalProperties")) {
            (Some(Value::Object(props)), _) if !props.is_empty() => format!(
                "an object with {}",
                props
                    .keys()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (_, Some(v @ Value::Object(_))) => {
                format!(
                    "an object whose values are {}s",
                    plural_base(&expected(v, defs))
                )
            }
            _ => "an object".into(),
        },
        _ => "a value".into(),
    }
}

/// "a string" -> "string", for "an array of strings".
fn plural_base(s: &str) -> &str {
    s.strip_prefix("a ")
        .or_else(|| s.strip_prefix("an "))
        .unwrap_or(s)
}

/// A `$ref` to the schema's own definitions, followed once.
fn resolve<'a>(p: &'a Value, defs: Option<&'a JsonObject>) -> &'a Value {
    p.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| defs?.get(name))
        .unwrap_or(p)
}

/// The JSON type of a value, for "not …".
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_u64() => "a whole number",
        Value::Number(n) if n.is_i64() => "a negative number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether `v` has the type `p` asks for (nested arrays and objects included); the path
/// of the first mismatch and what was expected there.
fn mismatch(v: &Value, p: &Value, defs: Option<&JsonObject>, path: &str) -> Option<String> {
    let p = resolve(p, defs);
    let ok = match p.get("type").and_then(Value::as_str) {
        Some("string") => v.is_string(),
        Some("integer") => match v.as_number() {
            Some(n) if p.get("minimum").and_then(Value::as_f64) == Some(0.0) => n.is_u64(),
            Some(n) => n.is_u64() || n.is_i64(),
            None => false,
        },
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("array") => {
            let Some(items) = v.as_array() else {
                return Some(wrong(path, p, v, defs));
            };
            if let Some(item) = p.get("items") {
                for (i, x) in items.iter().enumerate() {
                    if let Some(m) = mismatch(x, item, defs, &format!("{path}[{i}]")) {
                        return Some(m);
                    }
                }
            }
            true
        }
        Some("object") => {
            let Some(obj) = v.as_object() else {
                return Some(wrong(path, p, v, defs));
            };
            if let Some(schema) = p.as_object()
                && let Some(m) = object(obj, schema, defs, &format!("{path}."))
            {
                return Some(m);
            }
            true
        }
        _ => true,
    };
    (!ok).then(|| wrong(path, p, v, defs))
}

fn wrong(path: &str, p: &Value, v: &Value, defs: Option<&JsonObject>) -> String {
    format!("`{path}` must be {}, not {}", expected(p, defs), kind(v))
}

/// An object's fields against an object schema: unknown fields (when the schema allows no
/// others), missing required ones, then each field's type. `prefix` names where it is.
fn object(
    obj: &serde_json::Map<String, Value>,
    schema: &JsonObject,
    defs: Option<&JsonObject>,
    prefix: &str,
) -> Option<String> {
    let props = schema.get("properties").and_then(Value::as_object);
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    if let Some(props) = props
        && closed
        && let Some(unknown) = obj.keys().find(|k| !props.contains_key(k.as_str()))
    {
        let names: Vec<&str> = props.keys().map(String::as_str).collect();
        let close = crate::lang::closest(unknown, names.iter().copied());
        return Some(format!(
            "unknown field `{prefix}{unknown}`.{} The fields are: {}",
            did_you_mean(close),
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if obj.get(name).is_none_or(Value::is_null) {
            let p = props.and_then(|p| p.get(name)).unwrap_or(&Value::Null);
            let what = p
                .get("description")
                .and_then(Value::as_str)
                .map(|d| format!(": {}", first_sentence(d)))
                .unwrap_or_default();
            return Some(format!(
                "missing field `{prefix}{name}` ({}{what})",
                expected(p, defs)
            ));
        }
    }
    if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        // A map (`env`): every value has the one schema.
        for (k, v) in obj {
            if let Some(m) = mismatch(v, additional, defs, &format!("{prefix}{k}")) {
                return Some(m);
            }
        }
    }
    for (k, v) in obj {
        if v.is_null() {
            continue; // an optional field left empty
        }
        if let Some(p) = props.and_then(|p| p.get(k))
            && let Some(m) = mismatch(v, p, defs, &format!("{prefix}{k}"))
        {
            return Some(m);
        }
    }
    None
}

fn first_sentence(d: &str) -> &str {
    let d = d.trim();
    match d.find(". ") {
        Some(i) => &d[..i],
        None => d.trim_end_matches('.'),
    }
}

/// Check a call's arguments against its tool's input schema.
pub(super) fn check(
    tool: &str,
    args: Option<&JsonObject>,
    schema: &JsonObject,
) -> Result<(), ToolError> {
    let empty = JsonObject::new();
    let args = args.unwrap_or(&empty);
    let defs = schema.get("$defs").and_then(Value::as_object);
    match object(args, schema, defs, "") {
        None => Ok(()),
        Some(problem) => Err(invalid(tool, &problem, schema)),
    }
}

/// Other names a tool's fields are known by: `run-code` takes `language` for `languageId`
/// (what the session tools call it). Renamed before the check.
const ALIASES: &[(&str, &str, &str)] = &[("run-code", "language", "languageId")];

/// A field given by another name ([`ALIASES`]) under its own; both at once is a mistake.
pub(super) fn unalias(
    tool: &str,
    args: Option<&mut JsonObject>,
    schema: &JsonObject,
) -> Result<(), ToolError> {
    let Some(args) = args else {
        return Ok(());
    };
    for (_, alias, field) in ALIASES.iter().filter(|(t, ..)| *t == tool) {
        if let Some(v) = args.remove(*alias) {
            if args.contains_key(*field) {
                let problem = format!("`{alias}` and `{field}` are the same field; give one");
                return Err(invalid(tool, &problem, schema));
            }
            args.insert(field.to_string(), v);
        }
    }
    Ok(())
}

/// The message for arguments the tool could not take.
pub(super) fn invalid(tool: &str, problem: &str, schema: &JsonObject) -> ToolError {
    ToolError::invalid(format!(
        "invalid arguments for {tool}: {problem}. Example: {}",
        example(tool, schema)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> JsonObject {
        let Value::Object(o) = json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "code": {"type": "string", "description": "The program's source code. More."},
                "languageId": {"type": "string"},
                "timeout_ms": {"type": "integer", "minimum": 0},
                "args": {"type": "array", "items": {"type": "string"}},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "files": {"type": "array", "items": {"$ref": "#/$defs/F"}}
            },
            "required": ["code", "languageId"],
            "$defs": {"F": {"type": "object", "additionalProperties": false, "properties": {
                "name": {"type": "string"}, "path": {"type": "string"},
                "content": {"type": "string"}}}}
        }) else {
            unreachable!()
        };
        o
    }

    fn problem(args: Value) -> String {
        let Value::Object(a) = args else { panic!() };
        match check("run-code", Some(&a), &schema()) {
            Ok(()) => String::new(),
            Err(e) => e.message,
        }
    }

    #[test]
    fn good_calls_pass() {
        assert_eq!(problem(json!({"code": "1", "languageId": "py"})), "");
        assert_eq!(
            problem(json!({"code": "1", "languageId": "py", "timeout_ms": null,
                           "args": ["a"], "env": {"A": "b"},
                           "files": [{"name": "x", "content": "y"}]})),
            ""
        );
    }

    #[test]
    fn language_is_an_alias_of_language_id() {
        let Value::Object(mut a) = json!({"code": "1", "language": "py"}) else {
            panic!()
        };
        unalias("run-code", Some(&mut a), &schema()).unwrap();
        assert_eq!(
            Value::Object(a.clone()),
            json!({"code": "1", "languageId": "py"})
        );
        assert!(check("run-code", Some(&a), &schema()).is_ok());
        let Value::Object(mut both) = json!({"code": "1", "language": "py", "languageId": "r"})
        else {
            panic!()
        };
        let e = unalias("run-code", Some(&mut both), &schema()).unwrap_err();
        assert!(e.message.contains("give one"), "{}", e.message);
        // Other tools keep their own `language`.
        let Value::Object(mut start) = json!({"language": "py"}) else {
            panic!()
        };
        unalias("session_start", Some(&mut start), &schema()).unwrap();
        assert_eq!(Value::Object(start), json!({"language": "py"}));
    }

    #[test]
    fn each_mistake_names_its_field_and_what_it_expects() {
        let m = problem(json!({"languageId": "python"}));
        assert!(
            m.contains("missing field `code` (a string: The program's source code)"),
            "{m}"
        );
        assert!(
            m.contains(r#"Example: {"languageId": "python", "code": "print(1 + 1)"}"#),
            "{m}"
        );
        let m = problem(json!({"code": "1", "languageId": "py", "timeout": 5}));
        assert!(
            m.contains("unknown field `timeout`. Did you mean \"timeout_ms\"?"),
            "{m}"
        );
        let m = problem(json!({"code": "1", "languageId": "py", "timeout_ms": -1}));
        assert!(
            m.contains("`timeout_ms` must be a whole number, 0 or more, not a negative number"),
            "{m}"
        );
        let m = problem(json!({"code": "1", "languageId": "py", "timeout_ms": "5"}));
        assert!(m.contains("not a string"), "{m}");
        let m = problem(json!({"code": "1", "languageId": "py", "args": ["a", 2]}));
        assert!(
            m.contains("`args[1]` must be a string, not a whole number"),
            "{m}"
        );
        let m = problem(json!({"code": "1", "languageId": "py", "env": {"A": 1}}));
        assert!(m.contains("`env.A` must be a string"), "{m}");
        let m = problem(json!({"code": "1", "languageId": "py", "files": [{"nme": "x"}]}));
        assert!(
            m.contains("unknown field `files[0].nme`. Did you mean \"name\"?"),
            "{m}"
        );
        assert!(
            m.contains("`name`, `path`") || m.contains("`content`"),
            "{m}"
        );
        let m = problem(json!({"code": "1", "languageId": "py", "files": ["x.csv"]}));
        assert!(
            m.contains("`files[0]` must be an object with `content`, `name`, `path`, not a string"),
            "{m}"
        );
    }
}
