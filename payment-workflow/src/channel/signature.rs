//! The `Channel-Signature` of a notification (`contracts/channel.md`, Notifications):
//! `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`, several `v1=` while a secret is rotated.
//! The channel signs (the mock does, here); the receiver verifies, in constant time.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a signature's `t` may be from the receiver's clock, either way (5 minutes).
pub const TOLERANCE_SECS: i64 = 300;

/// The MAC of `t.body` under `secret`, before it is finished.
fn mac(secret: &[u8], t: i64, body: &[u8]) -> HmacSha256 {
    #[allow(clippy::expect_used)]
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `hex(HMAC-SHA256(secret, "t.body"))`.
pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    hex::encode(mac(secret.as_bytes(), t, body).finalize().into_bytes())
}

/// The header value signing `body` at `t` with each of `secrets` (one `v1=` each).
pub fn header(secrets: &[&str], t: i64, body: &[u8]) -> String {
    let mut value = format!("t={t}");
    for secret in secrets {
        value.push_str(",v1=");
        value.push_str(&sign(secret, t, body));
    }
    value
}

/// A `Channel-Signature` header, parsed: its time and every `v1=` signature (undecodable ones dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// `t=`: unix seconds.
    pub t: i64,
    /// Every `v1=`, decoded from hex.
    pub v1: Vec<Vec<u8>>,
}

impl Signature {
    /// Parses a header value; `None` when it has no `t=` or no `v1=`.
    pub fn parse(value: &str) -> Option<Self> {
        let mut t = None;
        let mut v1 = Vec::new();
        for part in value.split(',') {
            match part.trim().split_once('=') {
                Some(("t", seconds)) => t = seconds.parse::<i64>().ok(),
                Some(("v1", hex)) => v1.extend(decode_hex(hex)),
                _ => {}
            }
        }
        if v1.is_empty() {
            return None;
        }
        Some(Self { t: t?, v1 })
    }

    /// Whether `t` is within the tolerance of `now_secs` and one of the `v1=` is the MAC of `body` under one of
    /// `secrets`. Every pair is compared, each in constant time ([`Mac::verify_slice`]), so the time taken says
    /// nothing of which secret or signature came closest.
    pub fn verifies(&self, secrets: &[&str], body: &[u8], now_secs: i64) -> bool {
        let fresh = (now_secs - self.t).abs() <= TOLERANCE_SECS;
        let mut valid = false;
        for secret in secrets {
            let expected = mac(secret.as_bytes(), self.t, body);
            for signature in &self.v1 {
                valid |= expected.clone().verify_slice(signature).is_ok();
            }
        }
        fresh && valid
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || hex.len() > 256 {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_with_its_secret_body_and_time() {
        let body = br#"{"id":"ntf_1"}"#;
        let h = header(&["old", "new"], 1_000, body);
        let sig = Signature::parse(&h).unwrap();
        assert_eq!(sig.v1.len(), 2);
        assert!(sig.verifies(&["new"], body, 1_000));
        assert!(sig.verifies(&["other", "old"], body, 1_299));
        assert!(!sig.verifies(&["new"], body, 1_301), "stale");
        assert!(!sig.verifies(&["new"], body, 699), "from the future");
        assert!(!sig.verifies(&["another"], body, 1_000));
        assert!(!sig.verifies(&["new"], br#"{"id":"ntf_2"}"#, 1_000), "tampered");
        assert!(Signature::parse("t=1").is_none());
        assert!(Signature::parse("v1=00").is_none());
        // A known answer, computed independently (Python's hmac module).
        assert_eq!(
            sign("whsec_test", 1_700_000_000, br#"{"id":"ntf_1"}"#),
            "2efcb619448fa4550b37d7d437dc84f49ad35d8e02cbbe107ecffeb34d0fccd9"
        );
    }
}
