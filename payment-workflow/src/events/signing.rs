//! Standard Webhooks signatures: `v1,<base64 of HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, the key being the
//! secret's base64 part decoded; during a rotation one signature per secret, space-separated, so a receiver that
//! knows either verifies. Secrets are `whsec_` and 32 random bytes in base64.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// A new secret: `whsec_` and 32 random bytes, base64.
pub fn new_secret() -> String {
    // Two v4 UUIDs (244 random bits) hashed into 32 bytes of uniform form.
    let seed = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    format!("whsec_{}", STANDARD.encode(Sha256::digest(seed.as_bytes())))
}

/// The signature of `body` sent as `id` at `timestamp` (Unix seconds) with `secret`; `None` for a secret that is
/// not `whsec_<base64>` (none this service made).
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = STANDARD.decode(secret.strip_prefix("whsec_")?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    Some(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// The `webhook-signature` header: one signature per secret, space-separated.
pub fn signature_header(secrets: &[&str], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets.iter().filter_map(|s| sign(s, id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference implementations.
    #[test]
    fn the_specification_example_signs_alike() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let signed = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body);
        assert_eq!(signed.as_deref(), Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="));
    }

    #[test]
    fn secrets_are_new_and_usable() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(a.starts_with("whsec_") && sign(&a, "evt", 1, b"{}").is_some());
        let header = signature_header(&[&a, &b], "evt", 1, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        assert_eq!(sign("not a secret", "evt", 1, b"{}"), None);
    }
}
