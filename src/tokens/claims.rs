//! A token's claims as JSON that says one thing: an object whose keys are never written twice
//! (at any depth; serde_json would keep the last copy silently, so two readers of one token
//! could see two different tenants), and the dotted paths that name a claim in it.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// The claims of a token: a JSON object without duplicate keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Claims(pub Map<String, Value>);

/// A JSON value read with duplicate keys refused.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(v) = map.next_value()?;
            if out.insert(key.clone(), v).is_some() {
                return Err(de::Error::custom(format_args!(
                    "the key {key:?} is written twice"
                )));
            }
        }
        Ok(Value::Object(out))
    }
}

impl<'de> Deserialize<'de> for Claims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Strict::deserialize(d)?.0 {
            Value::Object(m) => Ok(Claims(m)),
            _ => Err(de::Error::custom("the claims are not a JSON object")),
        }
    }
}

/// A claim named by a dotted path (`org.id`: the `id` member of the `org` object). A claim
/// whose own name has a dot is found too: the whole name is tried first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPath(pub(super) Box<str>);

impl ClaimPath {
    /// A path of non-empty names separated by dots.
    pub fn parse(text: &str) -> Result<ClaimPath, String> {
        if text.is_empty() || text.split('.').any(str::is_empty) {
            return Err(format!(
                "{text:?} is not a claim path: names separated by dots, such as org_id or org.id"
            ));
        }
        Ok(ClaimPath(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The claim's value, if the claims have it.
    pub fn find<'c>(&self, claims: &'c Claims) -> Option<&'c Value> {
        if let Some(v) = claims.0.get(&*self.0) {
            return Some(v);
        }
        let mut parts = self.0.split('.');
        let mut v = claims.0.get(parts.next()?)?;
        for p in parts {
            v = v.as_object()?.get(p)?;
        }
        Some(v)
    }
}

/// A claim as text for a tenant id or a header: a string as it is, a number or a boolean in
/// JSON; `None` for an empty string, null, an array or an object.
pub fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(json: &str) -> Result<Claims, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn duplicate_keys_at_any_depth_are_refused() {
        assert!(claims(r#"{"sub":"a","sub":"b"}"#).is_err());
        assert!(claims(r#"{"org":{"id":1,"id":2}}"#).is_err());
        assert!(claims(r#"{"l":[{"a":1,"a":1}]}"#).is_err());
        assert!(claims(r#"[1,2]"#).is_err());
        assert!(claims(r#"{"sub":"a","org":{"id":"x"}}"#).is_ok());
    }

    #[test]
    fn paths_reach_into_objects() {
        let c = claims(r#"{"sub":"u1","org":{"id":"acme","n":7},"a.b":"dotted"}"#).unwrap();
        let find = |p: &str| ClaimPath::parse(p).unwrap().find(&c).and_then(as_text);
        assert_eq!(find("sub").as_deref(), Some("u1"));
        assert_eq!(find("org.id").as_deref(), Some("acme"));
        assert_eq!(find("org.n").as_deref(), Some("7"));
        assert_eq!(find("a.b").as_deref(), Some("dotted"));
        assert_eq!(find("org"), None);
        assert_eq!(find("org.missing"), None);
        assert!(ClaimPath::parse("org..id").is_err());
        assert!(ClaimPath::parse("").is_err());
    }
}
