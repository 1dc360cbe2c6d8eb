//! The keys an issuer signs its tokens with: a JWKS document (RFC 7517) read into keys ready to
//! verify with. Only signature keys of the asymmetric kinds are taken (RSA, EC, OKP); a
//! symmetric (`oct`) key in a JWKS is never used, so no public document can become an HMAC
//! secret. A key that names its `alg` verifies tokens of that algorithm only.

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;
use std::str::FromStr;

/// One verification key.
pub struct Key {
    pub kid: Option<Box<str>>,
    /// The algorithm the key is for, when the JWKS says.
    pub alg: Option<Algorithm>,
    pub key: DecodingKey,
}

/// The keys of one issuer, as last read.
#[derive(Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
}

/// The most keys one JWKS may bring (identity providers publish two or three).
pub const MAX_KEYS: usize = 64;

impl KeySet {
    /// Read a JWKS document. Keys that cannot verify signatures here are left out, each with
    /// the reason (for the log); a document that is no JWKS at all is an error.
    pub fn parse(doc: &[u8]) -> Result<(KeySet, Vec<String>), String> {
        let v: Value =
            serde_json::from_slice(doc).map_err(|e| format!("not a JWKS document: {e}"))?;
        let Some(list) = v.get("keys").and_then(Value::as_array) else {
            return Err("not a JWKS document: no \"keys\" array".to_string());
        };
        let mut out = KeySet::default();
        let mut skipped = Vec::new();
        for (i, k) in list.iter().enumerate() {
            if out.keys.len() == MAX_KEYS {
                skipped.push(format!("keys past the first {MAX_KEYS} are not read"));
                break;
            }
            match key_of(k) {
                Ok(key) => out.keys.push(key),
                Err(why) => skipped.push(format!("key {i}: {why}")),
            }
        }
        Ok((out, skipped))
    }

    /// The keys that may have signed a token with this `kid` (none: every key) and `alg`.
    pub fn candidates<'k>(
        &'k self,
        kid: Option<&'k str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'k Key> + 'k {
        self.keys.iter().filter(move |k| {
            kid.is_none_or(|id| k.kid.as_deref() == Some(id)) && k.alg.is_none_or(|a| a == alg)
        })
    }

    /// Does a key carry this id?
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

fn key_of(v: &Value) -> Result<Key, String> {
    let jwk: Jwk = serde_json::from_value(v.clone()).map_err(|e| format!("not a JWK: {e}"))?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Err("an encryption key (\"use\": \"enc\")".to_string());
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_)
        | AlgorithmParameters::EllipticCurve(_)
        | AlgorithmParameters::OctetKeyPair(_) => {}
        AlgorithmParameters::OctetKey(_) => {
            return Err("a symmetric (\"oct\") key: never used to verify".to_string())
        }
        _ => return Err("a key type not supported".to_string()),
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(a) => Some(
            Algorithm::from_str(&a.to_string())
                .map_err(|_| format!("algorithm {a} is not one of a signature"))?,
        ),
    };
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("unusable key: {e}"))?;
    Ok(Key {
        kid: jwk.common.key_id.map(String::into_boxed_str),
        alg,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_and_encryption_keys_are_left_out() {
        let doc = br#"{"keys":[
            {"kty":"oct","kid":"s","k":"c2VjcmV0"},
            {"kty":"OKP","crv":"Ed25519","kid":"e","use":"enc","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"Ed25519","kid":"ok","alg":"EdDSA","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"XYZ"}
        ]}"#;
        let (set, skipped) = KeySet::parse(doc).unwrap();
        assert_eq!(set.keys.len(), 1, "{skipped:?}");
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(set.has_kid("ok"));
        assert_eq!(set.candidates(Some("ok"), Algorithm::EdDSA).count(), 1);
        // a key that names its algorithm verifies that one only
        assert_eq!(set.candidates(Some("ok"), Algorithm::HS256).count(), 0);
        assert_eq!(set.candidates(None, Algorithm::EdDSA).count(), 1);
        // at most MAX_KEYS are read
        let many: Vec<String> = (0..MAX_KEYS + 3)
            .map(|i| {
                format!(r#"{{"kty":"OKP","crv":"Ed25519","kid":"k{i}","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}}"#)
            })
            .collect();
        let doc = format!(r#"{{"keys":[{}]}}"#, many.join(","));
        let (set, skipped) = KeySet::parse(doc.as_bytes()).unwrap();
        assert_eq!(set.keys.len(), MAX_KEYS);
        assert_eq!(skipped, ["keys past the first 64 are not read"]);
        assert!(KeySet::parse(b"{}").is_err());
        assert!(KeySet::parse(b"not json").is_err());
    }
}
