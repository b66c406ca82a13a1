//! A payment command as it arrives (`contracts/mq.md`), and the answer as it leaves: parsing a delivery
//! into a command or the reason it is not one, and writing the answer's bytes.

use lapin::message::Delivery;
use lapin::types::ShortString;
use onceflow_payments::{Currency, OrderNo, PayResponse, PaymentRequest, RequestNo};
use serde::{Deserialize, Serialize};

/// Largest command body read; a larger one is a bad message, never parsed.
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// A [`PaymentRequest`] as a queued command carries it: all four fields required and valid, nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandBody {
    order_no: OrderNo,
    amount: i64,
    currency: Currency,
    request_no: RequestNo,
}

/// A valid command.
#[derive(Debug)]
pub(crate) struct Command {
    /// Where the answer goes.
    pub(crate) reply_to: ShortString,
    /// Copied onto the answer.
    pub(crate) correlation_id: ShortString,
    /// The payment asked for.
    pub(crate) request: PaymentRequest,
}

/// The queues answers may go to (`--reply-to-prefix`): a producer chooses `reply_to`, so without a bound it
/// could make the consumer write into any queue its credentials reach — another tenant's command queue, say.
#[derive(Debug, Clone)]
pub(crate) struct Replies {
    /// A queue whose name starts with one of these may take answers.
    prefixes: Vec<String>,
    /// Never these (the consumer's own command and dead-letter queues), whatever the prefixes say.
    own: [String; 2],
}

impl Replies {
    /// Answers to queues starting with one of `prefixes`, never to `own`.
    pub(crate) fn new(prefixes: Vec<String>, own: [String; 2]) -> Self {
        Self { prefixes, own }
    }

    /// Whether an answer may go to `queue`.
    fn allow(&self, queue: &str) -> bool {
        !self.own.iter().any(|own| own == queue) && self.prefixes.iter().any(|p| queue.starts_with(p.as_str()))
    }
}

/// The command in `delivery`, or why it is not one (a `reply_to` that `replies` does not allow included).
pub(crate) fn parse(delivery: &Delivery, replies: &Replies) -> Result<Command, String> {
    if delivery.data.len() > MAX_BODY {
        return Err(format!("the body is {} bytes, over the limit of {MAX_BODY}", delivery.data.len()));
    }
    let properties = &delivery.properties;
    let reply_to = properties.reply_to().clone().filter(|r| !r.as_str().is_empty());
    let Some(reply_to) = reply_to else {
        return Err("the command has no reply_to".into());
    };
    if !replies.allow(reply_to.as_str()) {
        return Err(format!("reply_to {} is not a queue answers may go to (--reply-to-prefix)", reply_to.as_str()));
    }
    let Some(correlation_id) = properties.correlation_id().clone() else {
        return Err("the command has no correlation_id".into());
    };
    let body: CommandBody = serde_json::from_slice(&delivery.data).map_err(|e| format!("invalid body: {e}"))?;
    let request = PaymentRequest::new(body.order_no, body.amount, body.currency, Some(body.request_no))
        .map_err(|e| format!("invalid body: {e}"))?;
    Ok(Command { reply_to, correlation_id, request })
}

/// The answer's JSON: `{"status": …, "body": …}`, the body as a JSON value. The same response gives the same
/// bytes (the stored body is byte-stable, and this adds nothing that varies).
#[derive(Serialize)]
struct Answer {
    status: u16,
    body: serde_json::Value,
}

/// The bytes of the answer to `response`.
pub(crate) fn answer_bytes(response: &PayResponse) -> Vec<u8> {
    let body =
        serde_json::from_str(&response.body).unwrap_or_else(|_| serde_json::Value::String(response.body.clone()));
    serde_json::to_vec(&Answer { status: response.status, body }).unwrap_or_default()
}

/// The `detail` of a problem body, for the dead-letter header.
pub(crate) fn detail_of(response: &PayResponse) -> String {
    serde_json::from_str::<serde_json::Value>(&response.body)
        .ok()
        .and_then(|b| b.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;

    fn delivery(data: &[u8], properties: BasicProperties) -> Delivery {
        let mut d = Delivery::mock(1, "".into(), "q".into(), false, data.to_vec());
        d.properties = properties;
        d
    }

    fn full() -> BasicProperties {
        BasicProperties::default().with_reply_to("answers".into()).with_correlation_id("c-1".into())
    }

    fn parse(d: &Delivery) -> Result<Command, String> {
        super::parse(d, &replies())
    }

    fn replies() -> Replies {
        Replies::new(vec!["answers".into(), "amq.rabbitmq.reply-to".into()], ["q".into(), "q.dead".into()])
    }

    #[test]
    fn answers_go_only_where_allowed() {
        let r = replies();
        for allowed in ["answers", "answers.acme", "amq.rabbitmq.reply-to.g1h2AA==.abc"] {
            assert!(r.allow(allowed), "{allowed}");
        }
        for refused in ["", "q", "q.dead", "other.commands", "answer", "amq.direct"] {
            assert!(!r.allow(refused), "{refused}");
        }
        let wide = Replies::new(vec!["q".into()], ["q".into(), "q.dead".into()]);
        assert!(!wide.allow("q") && !wide.allow("q.dead") && wide.allow("q.replies"));
        let elsewhere =
            BasicProperties::default().with_reply_to("other.commands".into()).with_correlation_id("c".into());
        let ok = br#"{"order_no":"O-1","amount":1000,"currency":"CNY","request_no":"R-1"}"#;
        assert!(parse(&delivery(ok, elsewhere)).unwrap_err().contains("reply_to"));
    }

    #[test]
    fn commands_parse_and_bad_ones_say_why() {
        let ok = br#"{"order_no":"O-1","amount":1000,"currency":"CNY","request_no":"R-1"}"#;
        let c = parse(&delivery(ok, full())).unwrap();
        assert_eq!((c.reply_to.as_str(), c.correlation_id.as_str()), ("answers", "c-1"));
        assert_eq!(c.request.request_no().map(|r| r.as_str()), Some("R-1"));
        for bad in [
            r#"{"order_no":"O 1","amount":1000,"currency":"CNY","request_no":"R-1"}"#,
            r#"{"order_no":"O-1","amount":0,"currency":"CNY","request_no":"R-1"}"#,
            r#"{"order_no":"O-1","amount":1000,"currency":"cny","request_no":"R-1"}"#,
            r#"{"order_no":"O-1","amount":1000,"currency":"CNY","request_no":".."}"#,
        ] {
            assert!(parse(&delivery(bad.as_bytes(), full())).is_err(), "{bad}");
        }
        assert!(parse(&delivery(ok, BasicProperties::default().with_correlation_id("c".into()))).is_err());
        assert!(parse(&delivery(ok, BasicProperties::default().with_reply_to("a".into()))).is_err());
        assert!(parse(&delivery(b"not json", full())).is_err());
        assert!(parse(&delivery(br#"{"order_no":"O-1","amount":1000,"currency":"CNY"}"#, full())).is_err());
        let extra = br#"{"order_no":"O-1","amount":1,"currency":"CNY","request_no":"R","token":"t"}"#;
        assert!(parse(&delivery(extra, full())).is_err());
        let big = vec![b' '; MAX_BODY + 1];
        assert!(parse(&delivery(&big, full())).unwrap_err().contains("over the limit"));
    }

    #[test]
    fn answers_are_byte_stable() {
        let r = PayResponse { status: 201, body: r#"{"a":1,"b":"x"}"#.into(), replayed: false, location: None };
        let again = PayResponse { replayed: true, ..r.clone() };
        assert_eq!(answer_bytes(&r), answer_bytes(&again));
        assert_eq!(String::from_utf8(answer_bytes(&r)).unwrap(), r#"{"status":201,"body":{"a":1,"b":"x"}}"#);
    }
}
