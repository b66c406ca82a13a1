//! The states an order, a token and a payment record go through: one enum each, stored as its text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Database, Decode, Encode, Type};

/// An order's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Payable.
    Pending,
    /// A payment attempt is in flight.
    Paying,
    /// Paid: never payable again.
    Paid,
}

/// An idempotency token's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    /// Issued, not used yet.
    Issued,
    /// Bound to a request that is being processed.
    InUse,
    /// Holds the final response, replayed to every repeat.
    Completed,
}

/// A payment record's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Being charged.
    Processing,
    /// Charged.
    Succeeded,
    /// Declined by the channel.
    Declined,
    /// Rejected before the channel, or failed and compensated.
    Failed,
}

/// Each enum's text, both ways, and its column: text on every backend (decoded through the text, so a value this
/// version does not know is an error, never a silent default).
macro_rules! stored_as_text {
    ($($ty:ident { $($variant:ident = $text:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// As stored and shown.
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }

        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    other => Err(format!("`{other}` is not a {}", stringify!($ty))),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl<DB: Database> Type<DB> for $ty
        where
            str: Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <str as Type<DB>>::type_info()
            }
            fn compatible(ty: &DB::TypeInfo) -> bool {
                <str as Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: Database> Encode<'q, DB> for $ty
        where
            &'static str: Encode<'q, DB>,
        {
            fn encode_by_ref(&self, buf: &mut DB::ArgumentBuffer) -> Result<IsNull, BoxDynError> {
                self.as_str().encode_by_ref(buf)
            }
        }

        impl<'r, DB: Database> Decode<'r, DB> for $ty
        where
            &'r str: Decode<'r, DB>,
        {
            fn decode(value: DB::ValueRef<'r>) -> Result<Self, BoxDynError> {
                Ok(<&'r str as Decode<'r, DB>>::decode(value)?.parse()?)
            }
        }
    )+};
}

stored_as_text! {
    OrderStatus { Pending = "pending", Paying = "paying", Paid = "paid" }
    TokenState { Issued = "issued", InUse = "in_use", Completed = "completed" }
    PaymentStatus { Processing = "processing", Succeeded = "succeeded", Declined = "declined", Failed = "failed" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_serde_agree() {
        for s in [TokenState::Issued, TokenState::InUse, TokenState::Completed] {
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
            assert_eq!(s.as_str().parse::<TokenState>().unwrap(), s);
        }
        assert_eq!(serde_json::to_value(PaymentStatus::Succeeded).unwrap(), "succeeded");
        assert_eq!(serde_json::to_value(OrderStatus::Paying).unwrap(), "paying");
        assert!("expired".parse::<TokenState>().is_err());
    }
}
