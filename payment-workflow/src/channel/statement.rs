//! What the channel says of its own accord (`contracts/channel.md`, Notifications and Statement): a
//! notification's body, a statement's lines, and a statement read as a stream — a day can hold millions of
//! lines, so it is read a chunk at a time and never held whole.

use serde::{Deserialize, Serialize};

use super::ChannelError;

/// Whether an entry is a charge or a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A charge, numbered by its `merchant_request_no`.
    Charge,
    /// A refund, numbered by its `merchant_refund_no`.
    Refund,
}

impl EntryKind {
    /// As stored and shown: `charge`, `refund`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }

    /// From its stored text.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "charge" => Some(Self::Charge),
            "refund" => Some(Self::Refund),
            _ => None,
        }
    }
}

/// A notification's body: `{"id", "type", "created_at", "merchant_id", "data"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// The channel's id of this notification: every resend carries the same.
    pub id: String,
    /// `charge.succeeded`, `charge.declined`, `refund.succeeded` or `refund.failed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the channel made it (RFC 3339).
    pub created_at: String,
    /// The merchant it is for, whose secret signs it.
    pub merchant_id: String,
    /// The charge or refund, as a query answers it.
    pub data: serde_json::Value,
}

impl Notification {
    /// The entry it speaks of, its number and the final status it reports: `None` for a type or a `data` that
    /// is not one of the protocol's (a body that is not a notification).
    pub fn entry(&self) -> Option<(EntryKind, String, String, i64)> {
        let (kind, status) = self.kind.split_once('.')?;
        let (kind, number_field) = match (kind, status) {
            ("charge", "succeeded" | "declined") => (EntryKind::Charge, "merchant_request_no"),
            ("refund", "succeeded" | "failed") => (EntryKind::Refund, "merchant_refund_no"),
            _ => return None,
        };
        let number = self.data.get(number_field)?.as_str().filter(|n| !n.is_empty() && n.len() <= 255)?;
        let amount = self.data.get("amount")?.as_i64()?;
        // The data's own status, when it says, must be the type's.
        if self.data.get("status").and_then(serde_json::Value::as_str).is_some_and(|s| s != status) {
            return None;
        }
        let valid = !self.id.is_empty() && self.id.len() <= 255 && !self.merchant_id.is_empty();
        valid.then(|| (kind, number.to_owned(), status.to_owned(), amount))
    }
}

/// One line of a statement: a charge or a refund that reached a final status during the day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementLine {
    /// Charge or refund.
    pub kind: EntryKind,
    /// The charge's number (a refund's: the charge it refunds).
    pub merchant_request_no: String,
    /// A refund's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant_refund_no: Option<String>,
    /// A charge's id at the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// A refund's id at the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    /// A charge's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_no: Option<String>,
    /// Minor units.
    pub amount: i64,
    /// A charge's currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// `succeeded` or `declined` (charges), `succeeded` or `failed` (refunds).
    pub status: String,
    /// When the channel settled it (RFC 3339): the day it is booked on.
    pub settled_at: String,
}

impl StatementLine {
    /// The entry's number: a charge's `merchant_request_no`, a refund's `merchant_refund_no`.
    pub fn number(&self) -> &str {
        match self.kind {
            EntryKind::Charge => &self.merchant_request_no,
            EntryKind::Refund => self.merchant_refund_no.as_deref().unwrap_or_default(),
        }
    }

    /// Parses one NDJSON line; an entry without its number or with a status its kind cannot have is refused.
    pub fn parse(line: &[u8]) -> Result<Self, String> {
        let parsed: Self =
            serde_json::from_slice(line).map_err(|e| format!("a statement line is not an entry: {e}"))?;
        let status_ok = match parsed.kind {
            EntryKind::Charge => matches!(parsed.status.as_str(), "succeeded" | "declined"),
            EntryKind::Refund => matches!(parsed.status.as_str(), "succeeded" | "failed"),
        };
        let number = parsed.number();
        if !status_ok || number.is_empty() || number.len() > 255 {
            return Err(format!("a statement line has no number or an impossible status: {}", parsed.status));
        }
        Ok(parsed)
    }
}

/// Where a statement's bytes come from, a chunk at a time.
#[async_trait::async_trait]
pub trait StatementSource: Send {
    /// The next chunk of the body; `None` at its end.
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, ChannelError>;
}

/// A line longer than this is not a statement entry: the read fails rather than buffer without end.
const MAX_LINE: usize = 64 * 1024;

/// A day's statement, read line by line: memory holds one chunk and one line, whatever the day's length.
pub struct Statement {
    /// `Statement-Complete: true`: the day is closed, the channel adds nothing to it any more.
    pub complete: bool,
    source: Box<dyn StatementSource>,
    buffer: Vec<u8>,
    ended: bool,
}

impl std::fmt::Debug for Statement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Statement").field("complete", &self.complete).finish_non_exhaustive()
    }
}

impl Statement {
    /// A statement over `source`.
    pub fn new(complete: bool, source: Box<dyn StatementSource>) -> Self {
        Self { complete, source, buffer: Vec::new(), ended: false }
    }

    /// A statement of these lines (for channels that hold their statement in memory, and tests).
    pub fn of_lines(complete: bool, lines: Vec<StatementLine>) -> Self {
        struct Lines(std::vec::IntoIter<StatementLine>);
        #[async_trait::async_trait]
        impl StatementSource for Lines {
            async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, ChannelError> {
                Ok(self.0.next().map(|line| {
                    let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
                    bytes.push(b'\n');
                    bytes
                }))
            }
        }
        Self::new(complete, Box::new(Lines(lines.into_iter())))
    }

    /// The next line; `None` at the end. Blank lines are skipped.
    pub async fn next_line(&mut self) -> Result<Option<StatementLine>, ChannelError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                return StatementLine::parse(line).map(Some).map_err(ChannelError::Unknown);
            }
            if self.ended {
                let rest = std::mem::take(&mut self.buffer);
                let rest = rest.trim_ascii();
                return if rest.is_empty() {
                    Ok(None)
                } else {
                    StatementLine::parse(rest).map(Some).map_err(ChannelError::Unknown)
                };
            }
            if self.buffer.len() > MAX_LINE {
                return Err(ChannelError::Unknown("a statement line is longer than 64 KiB".into()));
            }
            match self.source.next_chunk().await? {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => self.ended = true,
            }
        }
    }
}

/// How long a statement's body may stall between two chunks before the read is given up (the channel is
/// then as good as down; the day is fetched again later).
const STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// A statement's body over HTTP.
struct HttpBody(reqwest::Response);

#[async_trait::async_trait]
impl StatementSource for HttpBody {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, ChannelError> {
        match tokio::time::timeout(STALL, self.0.chunk()).await {
            Ok(Ok(chunk)) => Ok(chunk.map(|c| c.to_vec())),
            Ok(Err(e)) => Err(ChannelError::Unknown(format!("the statement broke off: {e}"))),
            Err(_) => Err(ChannelError::Unknown("the statement stalled".into())),
        }
    }
}

/// `GET {base}/v1/statements/{day}?merchant_id=`: the statement as a stream, `None` for a `404`. The request
/// is not bound by the client's per-request timeout (a long day takes longer than a charge), only by
/// [`STALL`] between chunks.
pub(crate) async fn fetch(
    client: &reqwest::Client,
    base: &str,
    merchant_id: &str,
    day: chrono::NaiveDate,
) -> Result<Option<Statement>, ChannelError> {
    let url = format!("{base}/v1/statements/{}", day.format("%Y-%m-%d"));
    let sent = client
        .get(url)
        .query(&[("merchant_id", merchant_id)])
        .timeout(std::time::Duration::from_secs(24 * 60 * 60))
        .send();
    let response = tokio::time::timeout(STALL, sent)
        .await
        .map_err(|_| ChannelError::Unknown("the statement did not start".into()))?
        .map_err(|e| ChannelError::Unknown(e.to_string()))?;
    match response.status().as_u16() {
        200 => {
            let complete = response
                .headers()
                .get("statement-complete")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            Ok(Some(Statement::new(complete, Box::new(HttpBody(response)))))
        }
        404 => Ok(None),
        status @ (400 | 401 | 403 | 409 | 422) => {
            let body = response.text().await.unwrap_or_default();
            Err(ChannelError::Refused { status, body })
        }
        status => Err(ChannelError::Unknown(format!("the statement answered {status}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Chunks(Vec<&'static [u8]>);

    #[async_trait::async_trait]
    impl StatementSource for Chunks {
        async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, ChannelError> {
            Ok(if self.0.is_empty() { None } else { Some(self.0.remove(0).to_vec()) })
        }
    }

    #[tokio::test]
    async fn lines_are_read_across_chunks() {
        let a = br#"{"kind":"charge","merchant_request_no":"R-1","charge_id":"c","order_no":"O","amount":5,"currency":"CNY","status":"succeeded","settled_at":"2026-01-01T00:00:00Z"}"#;
        let (first, second) = a.split_at(40);
        let mut s = Statement::new(
            true,
            Box::new(Chunks(vec![first, second, b"\n\n", br#"{"kind":"refund","merchant_refund_no":"F","merchant_request_no":"R-1","refund_id":"r","amount":5,"status":"failed","settled_at":"x"}"#])),
        );
        let one = s.next_line().await.unwrap().unwrap();
        assert_eq!((one.kind, one.number(), one.amount), (EntryKind::Charge, "R-1", 5));
        let two = s.next_line().await.unwrap().unwrap();
        assert_eq!((two.kind, two.number()), (EntryKind::Refund, "F"));
        assert!(s.next_line().await.unwrap().is_none());
        let mut bad = Statement::new(true, Box::new(Chunks(vec![b"{\"kind\":\"charge\"}\n"])));
        assert!(bad.next_line().await.is_err());
    }
}
