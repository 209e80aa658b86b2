//! `Deserialize` for [`RawJson`] that works both directly from serde_json (verbatim text,
//! via serde_json's raw-value protocol) and from serde's buffered content (internally
//! tagged enums such as [`crate::Event`]), where the value is re-encoded as JSON text in
//! the order it is visited.

use std::fmt::{self, Write as _};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::model::RawJson;

/// serde_json's marker for raw values (stable since serde_json 1.0.29).
const RAW_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = d.deserialize_newtype_struct(RAW_TOKEN, RawOrTranscode)?;
        RawValue::from_string(text)
            .map(RawJson)
            .map_err(de::Error::custom)
    }
}

fn scalar<T: Serialize + ?Sized, E: de::Error>(v: &T) -> Result<String, E> {
    serde_json::to_string(v).map_err(E::custom)
}

/// Accepts serde_json's raw-value map, or any value (transcoded).
struct RawOrTranscode;

impl<'de> Visitor<'de> for RawOrTranscode {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(Transcode)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok("{}".to_string());
        };
        if first == RAW_TOKEN {
            return map.next_value::<String>();
        }
        transcode_map(Some(first), map)
    }
    forward_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<String, A::Error> {
        Transcode.visit_seq(seq)
    }
}

/// Re-encodes any visited value as JSON text.
struct Transcode;

impl<'de> DeserializeSeed<'de> for Transcode {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(Transcode)
    }
}

macro_rules! forward_scalars {
    () => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(if v { "true" } else { "false" }.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            scalar(&v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            scalar(v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<String, E> {
            Ok("null".to_string())
        }
        fn visit_none<E: de::Error>(self) -> Result<String, E> {
            Ok("null".to_string())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            d.deserialize_any(Transcode)
        }
    };
}
use forward_scalars;

impl<'de> Visitor<'de> for Transcode {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    forward_scalars!();
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(Transcode)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        let mut out = String::from("[");
        let mut first = true;
        while let Some(item) = seq.next_element_seed(Transcode)? {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&item);
        }
        out.push(']');
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<String, A::Error> {
        transcode_map(None, map)
    }
}

/// Re-encode the rest of a sequence as JSON text.
pub(crate) fn transcode_seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<String, A::Error> {
    Transcode.visit_seq(seq)
}

/// Re-encode the rest of a map as JSON text.
pub(crate) fn transcode_map_access<'de, A: MapAccess<'de>>(map: A) -> Result<String, A::Error> {
    transcode_map(None, map)
}

fn transcode_map<'de, A: MapAccess<'de>>(
    first_key: Option<String>,
    mut map: A,
) -> Result<String, A::Error> {
    let mut out = String::from("{");
    let mut key = match first_key {
        Some(k) => Some(k),
        None => map.next_key::<String>()?,
    };
    let mut first = true;
    while let Some(k) = key {
        if !first {
            out.push(',');
        }
        first = false;
        let v = map.next_value_seed(Transcode)?;
        let _ = write!(out, "{}:{}", scalar::<_, A::Error>(&k)?, v);
        key = map.next_key::<String>()?;
    }
    out.push('}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, Unknown};

    #[test]
    fn direct_keeps_text_and_buffered_keeps_order() {
        let text = r#"{"z":1,"a":[true,null,"s",1.5,-2],"m":{"y":{}}}"#;
        let direct: RawJson = serde_json::from_str(text).unwrap();
        assert_eq!(direct.get(), text);
        let ev = Event::Unknown(Unknown {
            message_type: "x".into(),
            raw: direct,
        });
        let s = serde_json::to_string(&ev).unwrap();
        let back: Event = serde_json::from_str(&s).unwrap();
        assert_eq!(back, ev);
        let v: RawJson = serde_json::from_value(serde_json::json!({"k": [1]})).unwrap();
        assert_eq!(v.get(), r#"{"k":[1]}"#);
    }
}
