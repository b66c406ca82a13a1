//! Bad input at every route: seeded random and malformed bodies, headers, keys, amounts, currencies, paths and
//! Unicode. Every answer must be below 500, every error a problem+json with a `code`, and a rejected request
//! must leave the stored state exactly as it was.

mod common;

use std::sync::Arc;

use common::{database, start};
use onceflow_api::Auth;
use onceflow_payments::MockChannel;
use reqwest::Method;
use serde_json::{Value, json};

/// splitmix64: reproducible dice.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn text(&mut self) -> String {
        const PIECES: [&str; 16] = [
            "O-1",
            "",
            " ",
            "ü",
            "💳",
            "\u{0}",
            "\u{202e}",
            "'; DROP TABLE orders;--",
            "%00",
            "../",
            "R-1",
            "CNY",
            "\"",
            "\\",
            "tok_",
            "a",
        ];
        let n = self.below(6);
        let mut s: String = (0..n).map(|_| *self.pick(&PIECES)).collect();
        if self.below(10) == 0 {
            s.push_str(&"x".repeat(self.below(300)));
        }
        s
    }

    fn value(&mut self) -> Value {
        match self.below(9) {
            0 => Value::Null,
            1 => json!(self.text()),
            2 => json!(*self.pick(&[i64::MIN, -1, 0, 1, 1000, i64::MAX])),
            3 => json!(1.5),
            4 => json!(1e30),
            5 => json!(true),
            6 => json!([self.text(), 1]),
            7 => json!({ "nested": { "deeper": self.text() } }),
            _ => json!(*self.pick(&["CNY", "cny", "CN", "CNYY", "€€€", "USD"])),
        }
    }

    fn body(&mut self) -> Vec<u8> {
        let fields = ["order_no", "amount", "currency", "request_no", "token", "extra"];
        match self.below(6) {
            0 => Vec::new(),
            1 => b"{\"order_no\": \"O-1\", \"amount\": 10".to_vec(),
            2 => (0..self.below(64)).map(|_| (self.next() & 0xff) as u8).collect(),
            3 => json!([1, 2, 3]).to_string().into_bytes(),
            _ => {
                let mut obj = serde_json::Map::new();
                for f in fields {
                    if self.below(3) > 0 {
                        obj.insert(f.to_owned(), self.value());
                    }
                }
                Value::Object(obj).to_string().into_bytes()
            }
        }
    }
}

async fn snapshot(url: &str) -> Vec<String> {
    let pool = sqlx::SqlitePool::connect(url).await.unwrap();
    let mut rows = Vec::new();
    for sql in [
        "SELECT tenant || '|' || order_no || '|' || status || '|' || version FROM orders ORDER BY 1",
        "SELECT token || '|' || state FROM idempotency_tokens ORDER BY 1",
        "SELECT request_no || '|' || status FROM payments ORDER BY 1",
        "SELECT workflow_id || '|' || state FROM workflows ORDER BY 1",
    ] {
        rows.extend(sqlx::query_scalar::<_, String>(sql).fetch_all(&pool).await.unwrap());
    }
    pool.close().await;
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_never_breaks_anything() {
    let url = database("sqlite").await.unwrap();
    let app = start(&url, Arc::new(MockChannel::reliable()), Auth::SingleTenant).await;
    app.order("O-1", 1000).await;
    let used = app.token().await;
    assert_eq!(app.pay(&used, json!({"order_no": "O-1", "amount": 1000, "currency": "CNY"})).await.status, 201);
    let fresh = app.token().await;

    let routes: [(Method, &str); 12] = [
        (Method::POST, "/v1/orders"),
        (Method::GET, "/v1/orders/{}"),
        (Method::POST, "/v1/payments"),
        (Method::GET, "/v1/payments/{}"),
        (Method::POST, "/pay"),
        (Method::GET, "/v1/workflows?state={}"),
        (Method::GET, "/v1/workflows/{}"),
        (Method::POST, "/v1/workflows/{}/retry"),
        (Method::POST, "/v1/workflows/{}/cancel"),
        (Method::PUT, "/v1/orders"),
        (Method::POST, "/v1/nothing/{}"),
        (Method::GET, "/readyz"),
    ];
    let mut dice = Dice(20261202);
    let mut before = snapshot(&url).await;
    let mut seen = std::collections::BTreeMap::<u16, u32>::new();
    for i in 0..1500 {
        let (method, template) = dice.pick(&routes).clone();
        let segment: String = url_encode(&dice.text());
        let path = template.replace("{}", &segment);
        let mut req = app.client.request(method.clone(), format!("{}{path}", app.base));
        match dice.below(4) {
            0 => {}
            1 => req = req.header("content-type", "application/json"),
            2 => {
                req = req.header(
                    "content-type",
                    *dice.pick(&[
                        "text/plain",
                        "application/xml",
                        "application/json; charset=utf-8",
                        "multipart/form-data",
                    ]),
                )
            }
            _ => req = req.header("content-type", "application/json"),
        }
        match dice.below(5) {
            0 => {}
            1 => req = req.header("idempotency-key", used.as_str()),
            2 => req = req.header("idempotency-key", fresh.as_str()),
            3 => {
                let key: String = dice.text().chars().filter(|c| c.is_ascii_graphic()).collect();
                req = req.header("idempotency-key", key)
            }
            _ => req = req.header("idempotency-key", "x".repeat(dice.below(400))),
        }
        if dice.below(4) == 0 {
            req = req.header("prefer", *dice.pick(&["wait=abc", "wait=-1", "wait=99999999999999999999", "wait=0"]));
        }
        let body = dice.body();
        let shown = String::from_utf8_lossy(&body).into_owned();
        let answer = common::into_answer(req.body(body).send().await.unwrap()).await;
        *seen.entry(answer.status).or_default() += 1;
        assert!(answer.status < 500, "#{i} {method} {path} {shown:?} -> {} {}", answer.status, answer.text);
        if answer.status >= 400 {
            assert_eq!(
                answer.header("content-type").as_deref(),
                Some("application/problem+json"),
                "#{i} {method} {path} {shown:?} -> {} {}",
                answer.status,
                answer.text
            );
            assert!(!answer.code().is_empty(), "#{i}: {}", answer.text);
        }
        let after = snapshot(&url).await;
        if answer.status >= 400 {
            assert_eq!(
                before, after,
                "#{i} {method} {path} {shown:?} was rejected ({}) but changed state",
                answer.status
            );
        }
        before = after;
    }
    println!("statuses seen: {seen:?}");
    for status in [400, 404, 405, 415] {
        assert!(seen.contains_key(&status), "the dice never produced a {status}: {seen:?}");
    }
    // The fresh token is still usable: nothing bound it.
    assert_eq!(app.pay(&fresh, json!({"order_no": "O-1", "amount": 1000, "currency": "CNY"})).await.status, 409);
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b == b'-' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}
