//! `meta.k8s.io/v1` Table answers, which kubectl asks for when it prints human output.

use serde_json::{Map, Value, json};

use crate::object;
use crate::registry::VersionDef;

/// Whether the client asked for a Table.
pub fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table") && first.contains("g=meta.k8s.io"))
}

fn columns(version: &VersionDef) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace.",
    })];
    for c in &version.columns {
        cols.push(json!({
            "name": c.name, "type": c.type_, "format": "", "priority": c.priority,
            "description": c.description,
        }));
    }
    if !version.columns.iter().any(|c| c.name == "Age") {
        cols.push(json!({
            "name": "Age", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
        }));
    }
    cols
}

/// Go's `duration.HumanDuration`, which the real server uses for date columns.
fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let minutes = s / 60;
    if minutes < 10 {
        return match s % 60 {
            0 => format!("{minutes}m"),
            rest => format!("{minutes}m{rest}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = s / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            rest => format!("{hours}h{rest}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            rest => format!("{}d{rest}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            rest => format!("{}y{rest}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(v: Option<&Value>) -> Value {
    let Some(ts) = v.and_then(Value::as_str) else {
        return Value::String("<unknown>".into());
    };
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => Value::String(human_duration(
            jiff::Timestamp::now().as_second() - t.as_second(),
        )),
        Err(_) => Value::String("<unknown>".into()),
    }
}

fn row(version: &VersionDef, obj: &Value) -> Value {
    let mut cells = vec![Value::String(object::name(obj).to_string())];
    for c in &version.columns {
        let cell = object::get_path(obj, &c.json_path);
        cells.push(if c.type_ == "date" {
            age(cell)
        } else {
            cell.cloned().unwrap_or(Value::Null)
        });
    }
    if !version.columns.iter().any(|c| c.name == "Age") {
        cells.push(age(obj.pointer("/metadata/creationTimestamp")));
    }
    json!({
        "cells": cells,
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| Value::Object(Map::new())),
        },
    })
}

/// A Table of `objects`; list metadata (`resourceVersion`, `continue`) goes in `metadata`.
pub fn render<'a>(
    version: &VersionDef,
    objects: impl IntoIterator<Item = &'a Value>,
    metadata: Value,
) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(version),
        "rows": objects.into_iter().map(|o| row(version, o)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::PrinterColumn;

    #[test]
    fn renders_printer_columns() {
        let v = VersionDef {
            name: "v1".into(),
            schema: None,
            status: false,
            scale: None,
            columns: vec![PrinterColumn {
                name: "Size".into(),
                type_: "integer".into(),
                json_path: ".spec.size".into(),
                description: String::new(),
                priority: 0,
            }],
        };
        let obj = json!({"metadata": {"name": "w", "creationTimestamp": crate::object::now()}, "spec": {"size": 3}});
        let t = render(&v, [&obj], json!({"resourceVersion": "5"}));
        let cells = t["rows"][0]["cells"].as_array().unwrap();
        assert_eq!(&cells[..2], &[json!("w"), json!(3)]);
        assert!(cells[2].as_str().unwrap().ends_with('s'));
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 3);
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 3 + 60), "3h1m");
        assert_eq!(human_duration(3600 * 30), "30h");
        assert_eq!(human_duration(3600 * 24 * 3), "3d");
    }
}
