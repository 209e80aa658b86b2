//! `ostler elicitation ID --accept [--content JSON | --field KEY=VALUE...] | --decline |
//! --cancel`: answer a pending elicitation (an MCP server of the session asking the user for
//! input, MCP `elicitation/create`; `ElicitationRequested`, listed by `ostler pending` with
//! kind `elicitation`).
//!
//! In form mode the input is a JSON object that fits the request's JSON Schema
//! (`requested_schema_json`: flat `properties` of type string, number, integer or boolean,
//! some `required`, strings maybe with an `enum`); in url mode the user opens the URL, then
//! accepts without content. The form's fields are read here too for the terminal prompt
//! (`prompt.rs`).

use std::fmt;

use anyhow::{Result, anyhow, bail};
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::pending::{answer_error, answer_hint, list, pick_or_settled};
use super::render::{clip, json_line};
use super::{ConnectArgs, connect};

#[derive(Debug, Clone, clap::Args)]
#[command(
    group(
        clap::ArgGroup::new("action")
            .args(["accept", "decline", "cancel"])
            .required(true)
    ),
    after_help = "Examples:
  ostler elicitation 7d1e --accept --field name=Ada --field age=36
  ostler elicitation 7d1e --accept --content '{\"name\": \"Ada\", \"subscribe\": true}'
  ostler elicitation 7d1e --accept         (url mode: once the URL was opened)
  ostler elicitation 7d1e --decline

`ostler pending` lists what waits (kind `elicitation`); `ostler pending --json` shows a
form's schema (`event.requested_schema`)."
)]
pub struct ElicitationArgs {
    /// Request id (or a unique prefix) of the elicitation, as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// Give the input asked for (form mode: with --field or --content; url mode: after
    /// opening the URL, no content)
    #[arg(long)]
    pub accept: bool,
    /// Refuse to give the input
    #[arg(long)]
    pub decline: bool,
    /// Dismiss the request without choosing
    #[arg(long)]
    pub cancel: bool,
    /// With --accept (form mode): the whole input, a JSON object
    #[arg(
        long,
        value_name = "JSON",
        conflicts_with_all = ["fields", "decline", "cancel"]
    )]
    pub content: Option<String>,
    /// With --accept (form mode): one field of the input (repeatable). VALUE is read as
    /// JSON when it parses (42, true), else as text; a field the form declares a string
    /// stays text
    #[arg(
        long = "field",
        value_name = "KEY=VALUE",
        conflicts_with_all = ["decline", "cancel"],
        value_parser = parse_field
    )]
    pub fields: Vec<(String, String)>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `KEY=VALUE` of `--field` (VALUE read later, against the form's fields).
pub fn parse_field(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("field {s:?}: expected KEY=VALUE")),
    }
}

/// The action the flags pick.
pub fn action(a: &ElicitationArgs) -> pb::ElicitationAction {
    if a.accept {
        pb::ElicitationAction::Accept
    } else if a.decline {
        pb::ElicitationAction::Decline
    } else {
        pb::ElicitationAction::Cancel
    }
}

/// Whether the request asks the user to open a URL (no content) rather than fill a form.
pub fn is_url(e: &pb::ElicitationRequested) -> bool {
    e.mode == "url"
}

/// `server: message` of a pending elicitation, plus ` (open URL)` in url mode.
pub fn describe(e: &pb::ElicitationRequested) -> String {
    let mut s = format!("{}: {}", e.mcp_server_name, clip(&e.message, 120));
    if is_url(e) && !e.url.is_empty() {
        s.push_str(&format!(" (open {})", clip(&e.url, 200)));
    }
    s
}

/// The JSON type a form field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    String,
    Number,
    Integer,
    Boolean,
    /// Anything else (or no `type`): JSON when it parses, else text.
    Other,
}

/// One value an `enum` field offers, with its label (`enumNames`, a `oneOf` entry's
/// `title`; else the value).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub value: Value,
    pub label: String,
}

/// One property of a form's schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    /// `title` (may be empty).
    pub title: String,
    /// `description` (may be empty).
    pub description: String,
    pub kind: FieldType,
    pub required: bool,
    /// `enum` (or `oneOf` / `anyOf` of `const`s): the values it takes; empty: any.
    pub choices: Vec<Choice>,
    pub default: Option<Value>,
}

/// A JSON object's members in document order (serde_json's `Map` sorts them; a form's
/// fields are asked in the order the server wrote them).
struct Ordered(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(Members)
    }
}

/// The fields of a form: the `properties` of `requested_schema_json`, in order (none when
/// the schema is empty or not an object schema).
pub fn fields(schema_json: &str) -> Vec<Field> {
    #[derive(Deserialize)]
    struct Props {
        properties: Ordered,
    }
    let schema: Value = serde_json::from_str(schema_json).unwrap_or(Value::Null);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = match serde_json::from_str::<Props>(schema_json) {
        Ok(p) => p.properties.0,
        Err(_) => schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
    };
    props
        .into_iter()
        .map(|(name, p)| {
            let required = required.contains(&name.as_str());
            Field::new(name, &p, required)
        })
        .collect()
}

/// The fields of the form `e` asks to fill, in the order the CLI gives
/// (`property_order` of its request: the stored schema's members may have been reordered),
/// else in the schema's.
pub fn form_fields(e: &pb::ElicitationRequested) -> Vec<Field> {
    let mut form = fields(&e.requested_schema_json);
    let request: Value = serde_json::from_str(&e.request_json).unwrap_or(Value::Null);
    if let Some(order) = request.get("property_order").and_then(Value::as_array) {
        let rank = |name: &str| {
            order
                .iter()
                .position(|o| o.as_str() == Some(name))
                .unwrap_or(usize::MAX)
        };
        // Stable: fields the order does not name keep their place after the named ones.
        form.sort_by_key(|f| rank(&f.name));
    }
    form
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Field {
    fn new(name: String, p: &Value, required: bool) -> Self {
        let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let kind = match p.get("type").and_then(Value::as_str) {
            Some("string") => FieldType::String,
            Some("number") => FieldType::Number,
            Some("integer") => FieldType::Integer,
            Some("boolean") => FieldType::Boolean,
            _ => FieldType::Other,
        };
        let mut choices: Vec<Choice> = Vec::new();
        if let Some(values) = p.get("enum").and_then(Value::as_array) {
            let names = p.get("enumNames").and_then(Value::as_array);
            for (i, v) in values.iter().enumerate() {
                let label = names
                    .and_then(|n| n.get(i))
                    .and_then(Value::as_str)
                    .map_or_else(|| text_of(v), str::to_owned);
                choices.push(Choice {
                    value: v.clone(),
                    label,
                });
            }
        } else if let Some(options) = p
            .get("oneOf")
            .or_else(|| p.get("anyOf"))
            .and_then(Value::as_array)
        {
            for o in options {
                if let Some(v) = o.get("const") {
                    let label = o
                        .get("title")
                        .and_then(Value::as_str)
                        .map_or_else(|| text_of(v), str::to_owned);
                    choices.push(Choice {
                        value: v.clone(),
                        label,
                    });
                }
            }
        }
        Field {
            name,
            title: s("title"),
            description: s("description"),
            kind,
            required,
            choices,
            default: p.get("default").cloned(),
        }
    }

    /// `string, required` / `one of red, green` / `boolean`: what the field takes.
    pub fn takes(&self) -> String {
        let mut s = if self.choices.is_empty() {
            match self.kind {
                FieldType::String => "text".to_owned(),
                FieldType::Number => "number".to_owned(),
                FieldType::Integer => "whole number".to_owned(),
                FieldType::Boolean => "yes/no".to_owned(),
                FieldType::Other => "JSON or text".to_owned(),
            }
        } else {
            format!(
                "one of {}",
                self.choices
                    .iter()
                    .map(|c| c.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        if self.required {
            s.push_str(", required");
        }
        s
    }

    /// The value `raw` gives this field, or why it does not fit.
    pub fn parse(&self, raw: &str) -> Result<Value, String> {
        if !self.choices.is_empty() {
            let t = raw.trim();
            return self
                .choices
                .iter()
                .find(|c| text_of(&c.value) == t)
                .or_else(|| {
                    self.choices.iter().find(|c| {
                        text_of(&c.value).eq_ignore_ascii_case(t) || c.label.eq_ignore_ascii_case(t)
                    })
                })
                .map(|c| c.value.clone())
                .ok_or_else(|| format!("{:?} is not one of: {}", clip(t, 60), self.takes()));
        }
        match self.kind {
            FieldType::String => Ok(Value::String(raw.to_owned())),
            FieldType::Integer => raw
                .trim()
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| format!("{:?} is not a whole number", clip(raw, 60))),
            FieldType::Number => match serde_json::from_str::<Value>(raw.trim()) {
                Ok(n @ Value::Number(_)) => Ok(n),
                _ => Err(format!("{:?} is not a number", clip(raw, 60))),
            },
            FieldType::Boolean => match raw.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "y" | "1" => Ok(Value::Bool(true)),
                "false" | "no" | "n" | "0" => Ok(Value::Bool(false)),
                _ => Err(format!("{:?} is not true or false", clip(raw, 60))),
            },
            FieldType::Other => Ok(loose(raw)),
        }
    }
}

/// One line typed for `f` at the terminal prompt: `Ok(None)` leaves an optional field out;
/// Enter takes the default; a number picks one of the choices; `Err` says why to ask again.
pub fn answer_field(f: &Field, line: &str) -> Result<Option<Value>, String> {
    let t = line.trim();
    if t.is_empty() {
        return match &f.default {
            Some(d) => Ok(Some(d.clone())),
            None if f.required => Err("this field is required".to_owned()),
            None => Ok(None),
        };
    }
    match f.parse(t) {
        Ok(v) => Ok(Some(v)),
        Err(why) => match t.parse::<usize>() {
            Ok(n) if n >= 1 && n <= f.choices.len() => Ok(Some(f.choices[n - 1].value.clone())),
            _ => Err(why),
        },
    }
}

/// A value without a schema: JSON when it parses (`42`, `true`, `[1]`), else the text.
pub fn loose(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// The content of an ACCEPT from `--content` or the `--field`s, read against the form's
/// fields: `None` in url mode (which takes none); in form mode a JSON object (`{}` when
/// neither is given and the form requires nothing).
pub fn content(
    e: &pb::ElicitationRequested,
    content: Option<&str>,
    given: &[(String, String)],
) -> Result<Option<Value>> {
    if is_url(e) {
        if content.is_some() || !given.is_empty() {
            bail!(
                "this elicitation asks to open a URL ({}), which takes no content: open it, \
                 then answer with --accept alone",
                clip(&e.url, 200)
            );
        }
        return Ok(None);
    }
    if let Some(text) = content {
        let v: Value =
            serde_json::from_str(text).map_err(|err| anyhow!("--content is not JSON: {err}"))?;
        if !v.is_object() {
            bail!("--content must be a JSON object, e.g. '{{\"name\": \"Ada\"}}'");
        }
        return Ok(Some(v));
    }
    let form = form_fields(e);
    let names = || {
        form.iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Map::new();
    for (key, raw) in given {
        if out.contains_key(key) {
            bail!("--field {key} is given twice");
        }
        let value = if form.is_empty() {
            loose(raw)
        } else {
            let Some(f) = form.iter().find(|f| f.name == *key) else {
                bail!("the form has no field {key:?} (its fields: {})", names());
            };
            f.parse(raw)
                .map_err(|why| anyhow!("--field {key}: {why}"))?
        };
        out.insert(key.clone(), value);
    }
    let missing: Vec<&str> = form
        .iter()
        .filter(|f| f.required && !out.contains_key(&f.name))
        .map(|f| f.name.as_str())
        .collect();
    if !missing.is_empty() {
        bail!(
            "the form requires {}: give {} with --field NAME=VALUE (its fields: {})",
            missing.join(", "),
            if missing.len() == 1 { "it" } else { "them" },
            form.iter()
                .map(|f| format!("{} ({})", f.name, f.takes()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(Some(Value::Object(out)))
}

/// `accepted` / `declined` / `cancelled`.
pub fn action_done(a: pb::ElicitationAction) -> &'static str {
    match a {
        pb::ElicitationAction::Accept => "accepted",
        pb::ElicitationAction::Decline => "declined",
        pb::ElicitationAction::Cancel => "cancelled",
        pb::ElicitationAction::Unspecified => "answered",
    }
}

/// `ostler elicitation ID ...`
pub async fn elicitation(a: ElicitationArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let all = list(&mut conn, &[]).await?;
    let p = pick_or_settled(&mut conn, &all, &a.id).await?;
    let Some(Payload::ElicitationRequested(e)) = p.event.as_ref().and_then(|e| e.payload.clone())
    else {
        bail!(
            "{} is not an elicitation: it is {}",
            p.request_id,
            answer_hint(&p)
        );
    };
    let act = action(&a);
    let content = if act == pb::ElicitationAction::Accept {
        content(&e, a.content.as_deref(), &a.fields)?
    } else {
        None
    };
    let resp = conn
        .sessions
        .respond_to_elicitation(pb::RespondToElicitationRequest {
            session_id: p.session_id.clone(),
            request_id: p.request_id.clone(),
            action: act as i32,
            content_json: content.as_ref().map(Value::to_string).unwrap_or_default(),
        })
        .await
        .map_err(|s| answer_error("elicitation", s))?
        .into_inner();
    if a.json {
        let r = resp.resolved.unwrap_or_default();
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id,
            "resolution": "answered", "action": super::json::elicitation_action_name(act as i32),
            "content": content, "resolved_by": r.resolved_by, "seq": resp.seq,
        }));
    } else {
        outln!(
            "{} {} in session {}",
            action_done(act),
            clip(&describe(&e), 160),
            p.session_id
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ElicitationArgs,
    }

    fn parse(args: &[&str]) -> Result<ElicitationArgs, clap::Error> {
        let mut v = vec!["elicitation"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| c.a)
    }

    const FORM: &str = r#"{"type":"object","properties":{
        "name":{"type":"string","title":"Your name"},
        "zip":{"type":"string"},
        "age":{"type":"integer"},
        "subscribe":{"type":"boolean","default":false},
        "colour":{"type":"string","enum":["red","green"],"enumNames":["Red","Green"]},
        "size":{"type":"string","oneOf":[{"const":"s","title":"Small"},{"const":"l","title":"Large"}]}
      },"required":["name","age"]}"#;

    fn form(schema: &str) -> pb::ElicitationRequested {
        pb::ElicitationRequested {
            request_id: "e1".into(),
            mcp_server_name: "crm".into(),
            message: "Who are you?".into(),
            mode: "form".into(),
            requested_schema_json: schema.into(),
            ..Default::default()
        }
    }

    fn given(pairs: &[&str]) -> Vec<(String, String)> {
        pairs.iter().map(|p| parse_field(p).unwrap()).collect()
    }

    #[test]
    fn flags_pick_one_action() {
        let a = parse(&["e1", "--accept", "--field", "name=Ada", "--field", "age=36"]).unwrap();
        assert_eq!(action(&a), pb::ElicitationAction::Accept);
        assert_eq!(
            a.fields,
            vec![("name".into(), "Ada".into()), ("age".into(), "36".into())]
        );
        assert_eq!(
            action(&parse(&["e1", "--decline"]).unwrap()),
            pb::ElicitationAction::Decline
        );
        assert_eq!(
            action(&parse(&["e1", "--cancel"]).unwrap()),
            pb::ElicitationAction::Cancel
        );
        assert!(parse(&["e1"]).is_err(), "an action is required");
        assert!(
            parse(&["e1", "--accept", "--decline"]).is_err(),
            "one action"
        );
        assert!(
            parse(&["e1", "--decline", "--field", "a=1"]).is_err(),
            "content only with --accept"
        );
        assert!(
            parse(&["e1", "--accept", "--content", "{}", "--field", "a=1"]).is_err(),
            "--content or --field"
        );
        assert!(parse(&["e1", "--accept", "--field", "=1"]).is_err());
        assert!(parse(&["e1", "--accept", "--field", "novalue"]).is_err());
    }

    #[test]
    fn fields_are_read_in_order_with_their_types() {
        let f = fields(FORM);
        let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["name", "zip", "age", "subscribe", "colour", "size"],
            "document order"
        );
        assert_eq!(f[0].kind, FieldType::String);
        assert_eq!(f[0].title, "Your name");
        assert!(f[0].required && f[2].required && !f[1].required);
        assert_eq!(f[2].kind, FieldType::Integer);
        assert_eq!(f[3].default, Some(Value::Bool(false)));
        assert_eq!(f[4].takes(), "one of Red, Green");
        assert_eq!(f[5].choices[1].value, json!("l"));
        assert_eq!(f[2].takes(), "whole number, required");
        assert!(fields("").is_empty());
        assert!(fields("{}").is_empty());
        assert!(fields(r#"{"properties": 3}"#).is_empty());
    }

    #[test]
    fn the_cli_property_order_comes_first() {
        let e = pb::ElicitationRequested {
            request_json: r#"{"property_order": ["size", "name", "age"]}"#.into(),
            ..form(FORM)
        };
        let names: Vec<String> = form_fields(&e).into_iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            ["size", "name", "age", "zip", "subscribe", "colour"],
            "named first, the others in schema order"
        );
        let names: Vec<String> = form_fields(&form(FORM))
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names[0], "name", "without one: the schema's order");
    }

    #[test]
    fn field_values_are_read_by_type() {
        let f = fields(FORM);
        assert_eq!(
            f[1].parse("02139"),
            Ok(json!("02139")),
            "a string stays text"
        );
        assert_eq!(f[2].parse(" 36 "), Ok(json!(36)));
        assert!(f[2].parse("3.5").is_err());
        assert_eq!(f[3].parse("yes"), Ok(json!(true)));
        assert_eq!(f[3].parse("false"), Ok(json!(false)));
        assert!(f[3].parse("maybe").is_err());
        assert_eq!(f[4].parse("green"), Ok(json!("green")));
        assert_eq!(f[4].parse("Red"), Ok(json!("red")), "by label");
        assert!(f[4].parse("blue").unwrap_err().contains("Red, Green"));
        assert_eq!(f[5].parse("Large"), Ok(json!("l")));
        let other = Field::new("x".into(), &json!({}), false);
        assert_eq!(other.parse("[1,2]"), Ok(json!([1, 2])));
        assert_eq!(other.parse("hello"), Ok(json!("hello")));
    }

    #[test]
    fn fields_build_the_content_object() {
        let e = form(FORM);
        let c = content(
            &e,
            None,
            &given(&["name=Ada Lovelace", "age=36", "zip=02139", "subscribe=true"]),
        )
        .unwrap();
        assert_eq!(
            c,
            Some(json!({"name": "Ada Lovelace", "age": 36, "zip": "02139", "subscribe": true}))
        );
        let e_missing = content(&e, None, &given(&["name=Ada"])).unwrap_err();
        assert!(
            e_missing.to_string().contains("requires age"),
            "{e_missing}"
        );
        let unknown = content(&e, None, &given(&["name=Ada", "age=1", "nick=A"])).unwrap_err();
        assert!(
            unknown.to_string().contains("no field \"nick\""),
            "{unknown}"
        );
        let twice = content(&e, None, &given(&["name=A", "name=B", "age=1"])).unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
        let bad = content(&e, None, &given(&["name=A", "age=old"])).unwrap_err();
        assert!(bad.to_string().contains("--field age"), "{bad}");

        // Without a schema: JSON when it parses (numbers, booleans), else text.
        let free = form("");
        let c = content(
            &free,
            None,
            &given(&["n=42", "ok=true", "who=Ada", "eq=a=b"]),
        )
        .unwrap();
        assert_eq!(
            c,
            Some(json!({"n": 42, "ok": true, "who": "Ada", "eq": "a=b"}))
        );
        assert_eq!(content(&free, None, &[]).unwrap(), Some(json!({})));

        // --content: a JSON object, passed as is.
        let c = content(&e, Some(r#"{"name":"Ada"}"#), &[]).unwrap();
        assert_eq!(c, Some(json!({"name": "Ada"})));
        assert!(content(&e, Some("[1]"), &[]).is_err());
        assert!(content(&e, Some("{oops"), &[]).is_err());

        // url mode takes none.
        let url = pb::ElicitationRequested {
            mode: "url".into(),
            url: "https://example.com/login".into(),
            ..form("")
        };
        assert_eq!(content(&url, None, &[]).unwrap(), None);
        assert!(content(&url, None, &given(&["a=1"])).is_err());
    }

    #[test]
    fn prompt_lines_become_values() {
        let f = fields(FORM);
        assert_eq!(answer_field(&f[0], "  Ada "), Ok(Some(json!("Ada"))));
        assert!(answer_field(&f[0], "").is_err(), "required");
        assert_eq!(answer_field(&f[1], ""), Ok(None), "optional: left out");
        assert_eq!(
            answer_field(&f[3], ""),
            Ok(Some(json!(false))),
            "the default"
        );
        assert_eq!(answer_field(&f[3], "y"), Ok(Some(json!(true))));
        assert_eq!(
            answer_field(&f[4], "2"),
            Ok(Some(json!("green"))),
            "by number"
        );
        assert_eq!(answer_field(&f[4], "red"), Ok(Some(json!("red"))));
        assert!(answer_field(&f[4], "3").is_err());
        let numbers = Field::new(
            "n".into(),
            &json!({"type": "integer", "enum": [1, 5]}),
            true,
        );
        assert_eq!(
            answer_field(&numbers, "5"),
            Ok(Some(json!(5))),
            "a value first"
        );
        assert_eq!(
            answer_field(&numbers, "2"),
            Ok(Some(json!(5))),
            "then a number"
        );
    }

    #[test]
    fn describe_names_server_message_and_url() {
        assert_eq!(describe(&form(FORM)), "crm: Who are you?");
        let url = pb::ElicitationRequested {
            mcp_server_name: "github".into(),
            message: "Sign in to continue".into(),
            mode: "url".into(),
            url: "https://github.com/login/device".into(),
            ..Default::default()
        };
        assert_eq!(
            describe(&url),
            "github: Sign in to continue (open https://github.com/login/device)"
        );
        let long = pb::ElicitationRequested {
            message: "x".repeat(500),
            ..form("")
        };
        assert!(describe(&long).chars().count() < 140);
    }
}
