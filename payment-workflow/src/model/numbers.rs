//! The refund numbers onceflow sends the channel, and why no two can ever be the same.
//!
//! A channel keeps one namespace of refund numbers per merchant (`contracts/channel.md`: refunds are idempotent
//! on `(merchant_id, merchant_refund_no)`), and two kinds of refund share it: the compensation of a cancelled
//! payment, refunded under `{request_no}-refund` ([`super::RequestNo`]'s, kept as it is for the payments in
//! flight that already use it), and a merchant's refund, whose number the tenant chooses. Both `request_no` and
//! `refund_no` are drawn from `A-Z a-z 0-9 . _ : -`, so no way of gluing a fixed text to a tenant's `refund_no`
//! out of that alphabet keeps the two apart (`refund-` + `X-refund` is the compensation of `refund-X`). A
//! merchant refund's number is therefore its `refund_no` behind [`MERCHANT_REFUND_PREFIX`], which holds `~`, a
//! character no `request_no` or `refund_no` can hold:
//!
//! - *disjoint*: every merchant refund number holds a `~`; a compensation's number, and any other number
//!   onceflow derives from a `request_no` with characters of that alphabet, holds none;
//! - *injective*: the prefix is fixed, so two `refund_no` give two numbers, and [`refund_no_of`] reads the
//!   `refund_no` back.
//!
//! `~` is unreserved in a URL (RFC 3986), so the number travels in a channel's path as it is.

use super::RefundNo;

/// What every merchant refund's channel number starts with; the `~` is what no `request_no` or `refund_no` holds.
pub const MERCHANT_REFUND_PREFIX: &str = "rf~";

/// The channel's `merchant_refund_no` of the tenant's refund `refund_no`.
pub fn merchant_refund_no(refund_no: &RefundNo) -> String {
    format!("{MERCHANT_REFUND_PREFIX}{refund_no}")
}

/// The `refund_no` whose channel number is `merchant_refund_no`, if it is a merchant refund's (a compensation's
/// number, or any other, is `None`).
pub fn refund_no_of(merchant_refund_no: &str) -> Option<RefundNo> {
    RefundNo::parse(merchant_refund_no.strip_prefix(MERCHANT_REFUND_PREFIX)?).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::RequestNo;

    /// Every valid number of up to `len` characters over `alphabet` (a subset of the numbers' alphabet).
    fn numbers(alphabet: &[char], len: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut layer = vec![String::new()];
        for _ in 0..len {
            layer = layer.iter().flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}"))).collect();
            all.extend(layer.iter().cloned());
        }
        all.into_iter().filter(|s| RequestNo::parse(s.as_str()).is_ok()).collect()
    }

    #[test]
    fn a_naive_prefix_collides_with_a_compensation() {
        // Why the prefix holds a character outside the alphabet: with `refund-`, the tenant's refund `X-refund`
        // and the compensation of the payment `refund-X` would be one number at the channel.
        let naive = |refund_no: &str| format!("refund-{refund_no}");
        let compensation = RequestNo::parse("refund-X").unwrap().refund_no();
        assert_eq!(naive("X-refund"), compensation);
        assert_ne!(merchant_refund_no(&RefundNo::parse("X-refund").unwrap()), compensation);
    }

    #[test]
    fn merchant_refund_numbers_are_injective_and_never_a_compensations() {
        // Exhaustively over short numbers of an alphabet rich in the compensation's own letters and separators,
        // and for the longest numbers too: no two refunds share a channel number, none is a compensation's, and
        // each reads back as its refund.
        let alphabet = ['r', 'e', 'f', 'u', 'n', 'd', '-', '.', '_', ':', 'X', '0'];
        let mut refunds: Vec<String> = numbers(&alphabet, 3);
        refunds.extend(
            ["refund", "X-refund", "-refund", "a-refund-refund", &"r".repeat(64), &"-".repeat(64)].map(String::from),
        );
        let mut seen: HashMap<String, String> = HashMap::new();
        for refund_no in &refunds {
            let parsed = RefundNo::parse(refund_no.as_str()).unwrap();
            let number = merchant_refund_no(&parsed);
            assert!(number.contains('~'), "{number}");
            assert_eq!(refund_no_of(&number).as_ref(), Some(&parsed), "{number} reads back");
            if let Some(other) = seen.insert(number.clone(), refund_no.clone()) {
                assert_eq!(&other, refund_no, "{other} and {refund_no} share {number}");
            }
        }
        for request_no in numbers(&alphabet, 3).iter().chain(refunds.iter()) {
            let compensation = RequestNo::parse(request_no.as_str()).unwrap().refund_no();
            assert!(!compensation.contains('~'), "{compensation}");
            assert!(!seen.contains_key(&compensation), "the compensation of {request_no} is a refund's number");
            assert_eq!(refund_no_of(&compensation), None, "{compensation} is no merchant refund's");
        }
    }

    #[test]
    fn only_a_merchant_refunds_number_reads_back() {
        for other in ["", "rf~", "rf~.", "rf~..", "rf~a~b", "rf-a", "R-1-refund", "RF~a"] {
            assert_eq!(refund_no_of(other), None, "{other}");
        }
        assert_eq!(refund_no_of("rf~RF-1").unwrap().as_str(), "RF-1");
    }
}
