//! A commit's arguments, bound once for sqlx and, when the group commit may batch the commit, once more as
//! text: a batch passes its members' arguments to `onceflow_batch` (migration 0059) as one `text[]`, where each
//! is quoted into the call of the member's prepared statement and converted to the statement's parameter type.
//! The binders (`rows.rs`, `commit.rs`) are written once for both, so the two cannot disagree on order.

use sqlx::{Encode, Postgres, Type};

use super::rows::PgQuery;
use crate::store::{StepKind, StepStatus, WorkflowState};

/// A value a commit binds: its Postgres type, as sqlx declares it for the parameter, and its text in that type.
pub(super) trait PgArg {
    /// The parameter's type in a `PREPARE`, the one sqlx sends for this Rust type.
    const TYPE: &'static str;
    /// Its text (`None`: SQL `NULL`).
    fn text(&self) -> Option<String>;
}

impl PgArg for &str {
    const TYPE: &'static str = "text";
    fn text(&self) -> Option<String> {
        Some((*self).to_owned())
    }
}

impl PgArg for String {
    const TYPE: &'static str = "text";
    fn text(&self) -> Option<String> {
        Some(self.clone())
    }
}

impl PgArg for i64 {
    const TYPE: &'static str = "bigint";
    fn text(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl PgArg for i32 {
    const TYPE: &'static str = "integer";
    fn text(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl PgArg for bool {
    const TYPE: &'static str = "boolean";
    fn text(&self) -> Option<String> {
        Some(self.to_string())
    }
}

/// The engine's states and kinds are stored (and bound) as their text.
macro_rules! as_text {
    ($($ty:ty),+) => {$(
        impl PgArg for $ty {
            const TYPE: &'static str = "text";
            fn text(&self) -> Option<String> {
                Some(self.as_str().to_owned())
            }
        }
    )+};
}
as_text!(WorkflowState, StepKind, StepStatus);

impl<T: PgArg> PgArg for Option<T> {
    const TYPE: &'static str = T::TYPE;
    fn text(&self) -> Option<String> {
        self.as_ref().and_then(PgArg::text)
    }
}

impl<T: PgArg> PgArg for &T {
    const TYPE: &'static str = T::TYPE;
    fn text(&self) -> Option<String> {
        (**self).text()
    }
}

/// What the binders bind into: an sqlx query, or [`Texts`].
pub(super) trait Bind: Sized {
    /// `self` with `value` bound as the next parameter.
    fn arg<'t, T: PgArg + Encode<'t, Postgres> + Type<Postgres>>(self, value: T) -> Self;
}

impl Bind for PgQuery<'_> {
    fn arg<'t, T: PgArg + Encode<'t, Postgres> + Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

/// A commit's arguments as a batch passes them: each parameter's type and text.
#[derive(Debug, Default)]
pub(super) struct Texts {
    /// Each parameter's type, as [`PgArg::TYPE`].
    pub(super) types: Vec<&'static str>,
    /// Each parameter's text.
    pub(super) values: Vec<Option<String>>,
}

impl Bind for Texts {
    fn arg<'t, T: PgArg + Encode<'t, Postgres> + Type<Postgres>>(mut self, value: T) -> Self {
        self.types.push(T::TYPE);
        self.values.push(value.text());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_keep_each_parameter_with_its_type() {
        let none: Option<&String> = None;
        let t = Texts::default().arg("a").arg(7_i64).arg(none).arg(true).arg(WorkflowState::Running).arg(3_i32);
        assert_eq!(t.types, ["text", "bigint", "text", "boolean", "text", "integer"]);
        let values: Vec<Option<&str>> = t.values.iter().map(Option::as_deref).collect();
        assert_eq!(values, [Some("a"), Some("7"), None, Some("true"), Some("running"), Some("3")]);
    }
}
