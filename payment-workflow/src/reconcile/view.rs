//! A (tenant, day)'s reconciliation as `GET /v1/reconciliations` and `onceflow reconcile` show it.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::Class;
use crate::store::{ChannelWordStore, ExceptionRow, ReconciliationRow};

/// Exceptions shown per reconciliation at most (the counts are always whole).
const SHOWN: i64 = 10_000;

/// One exception: every class but `matched`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReconciledException {
    /// Its class.
    pub class: String,
    /// `charge` or `refund`.
    pub kind: String,
    /// The charge's `request_no` or the refund's number.
    pub number: String,
    /// What onceflow holds under the number, if anything.
    #[schema(value_type = Option<Object>)]
    pub ours: Option<Value>,
    /// The channel's statement line, if it has one.
    #[schema(value_type = Option<Object>)]
    pub channel: Option<Value>,
    /// `none`, `settled` (the statement's word recorded for the workflow to settle) or `operator`.
    pub action: String,
}

impl From<ExceptionRow> for ReconciledException {
    fn from(r: ExceptionRow) -> Self {
        let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
        Self {
            class: r.class,
            kind: r.kind,
            number: r.number,
            ours: json(r.ours),
            channel: json(r.channel),
            action: r.action,
        }
    }
}

/// A (tenant, day)'s reconciliation.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Reconciliation {
    /// Whose.
    pub tenant: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub date: String,
    /// `complete`, or `partial` while that day's statement or a neighbour's needed to decide is not complete.
    pub state: String,
    /// When the run that made it ended (RFC 3339).
    pub ran_at: String,
    /// Every class, zeros included.
    pub counts: BTreeMap<String, u64>,
    /// Every class but `matched`.
    pub exceptions: Vec<ReconciledException>,
}

impl Reconciliation {
    /// The row, with its exceptions.
    pub(crate) fn of(row: ReconciliationRow, exceptions: Vec<ExceptionRow>) -> Self {
        let stored: BTreeMap<String, u64> = serde_json::from_str(&row.counts).unwrap_or_default();
        let counts =
            Class::ALL.iter().map(|c| (c.as_str().to_owned(), stored.get(c.as_str()).copied().unwrap_or(0))).collect();
        let ran_at = chrono::DateTime::from_timestamp_millis(row.ran_at)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default();
        Self {
            tenant: row.tenant,
            date: row.day,
            state: row.state,
            ran_at,
            counts,
            exceptions: exceptions.into_iter().map(Into::into).collect(),
        }
    }

    /// Counts and exceptions, for a terminal: one line per class, then one per exception.
    pub fn render(&self) -> String {
        let mut out = format!("{} {} {} (ran {})\n", self.tenant, self.date, self.state, self.ran_at);
        for class in Class::ALL {
            out.push_str(&format!(
                "  {:<20}{}\n",
                class.as_str(),
                self.counts.get(class.as_str()).copied().unwrap_or(0)
            ));
        }
        for e in &self.exceptions {
            let show = |v: &Option<Value>| v.as_ref().map_or_else(|| "-".to_owned(), Value::to_string);
            out.push_str(&format!(
                "  ! {} {} {} action={} ours={} channel={}\n",
                e.class,
                e.kind,
                e.number,
                e.action,
                show(&e.ours),
                show(&e.channel)
            ));
        }
        out
    }
}

/// The reconciliations of `day` (of `tenant` only, when given), each with its exceptions.
pub async fn reconciliations<S: ChannelWordStore>(
    store: &S,
    day: &str,
    tenant: Option<&str>,
) -> Result<Vec<Reconciliation>, sqlx::Error> {
    let mut all = Vec::new();
    for row in store.reconciliations_on(day, tenant).await? {
        let exceptions = store.exceptions_of(&row.run_id, SHOWN).await?;
        all.push(Reconciliation::of(row, exceptions));
    }
    Ok(all)
}
