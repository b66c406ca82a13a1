//! A workflow's compensations, kept as one JSON array in its `workflows` row (column `compensations`): a
//! payment registers four, which as rows of their own cost four heap and four index inserts per payment.
//! A commit that changes them writes the whole list, under the same fence as the rest of the row: the lease
//! makes its holder the list's only writer.

use serde::{Deserialize, Serialize};

use super::{CompensationRecord, CompensationStatus};
use crate::error::Result;

/// One element of the stored array: a [`CompensationRecord`] without the workflow id, which is the row's. The
/// status is its text (a status this version does not know fails the decoding).
#[derive(Serialize, Deserialize)]
struct Stored<S> {
    seq: i32,
    step_key: S,
    name: S,
    input: S,
    status: CompensationStatus,
}

/// The stored form of `comps`.
pub(crate) fn encode(comps: &[CompensationRecord]) -> Result<String> {
    let stored: Vec<Stored<&str>> = comps
        .iter()
        .map(|c| Stored { seq: c.seq, step_key: &*c.step_key, name: &*c.name, input: &*c.input, status: c.status })
        .collect();
    Ok(serde_json::to_string(&stored)?)
}

/// The compensations of workflow `workflow_id` from their stored form (none for `NULL`), in registration order.
pub(crate) fn decode(workflow_id: &str, stored: Option<&str>) -> Result<Vec<CompensationRecord>> {
    let Some(stored) = stored else { return Ok(Vec::new()) };
    let stored: Vec<Stored<String>> = serde_json::from_str(stored)?;
    let mut comps: Vec<CompensationRecord> = stored
        .into_iter()
        .map(|s| CompensationRecord {
            workflow_id: workflow_id.to_owned(),
            seq: s.seq,
            step_key: s.step_key,
            name: s.name,
            input: s.input,
            status: s.status,
        })
        .collect();
    comps.sort_by_key(|c| c.seq);
    Ok(comps)
}

/// The stored list with every failed compensation registered again (an operator's retry of the compensations).
pub(crate) fn reset_failed(workflow_id: &str, stored: Option<&str>) -> Result<String> {
    let mut comps = decode(workflow_id, stored)?;
    for c in comps.iter_mut().filter(|c| c.status == CompensationStatus::Failed) {
        c.status = CompensationStatus::Registered;
    }
    encode(&comps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(seq: i32, status: CompensationStatus) -> CompensationRecord {
        CompensationRecord {
            workflow_id: "w".into(),
            seq,
            step_key: format!("step{seq}"),
            name: "undo".into(),
            input: r#"{"a":"\"quoted\""}"#.into(),
            status,
        }
    }

    #[test]
    fn a_list_reads_back_as_written_in_registration_order() {
        let comps = vec![comp(1, CompensationStatus::Done), comp(0, CompensationStatus::Registered)];
        let back = decode("w", Some(&encode(&comps).unwrap())).unwrap();
        assert_eq!(back, vec![comps[1].clone(), comps[0].clone()]);
        assert!(decode("w", None).unwrap().is_empty());
    }

    #[test]
    fn a_retry_registers_failed_compensations_again() {
        let stored = encode(&[comp(0, CompensationStatus::Done), comp(1, CompensationStatus::Failed)]).unwrap();
        let back = decode("w", Some(&reset_failed("w", Some(&stored)).unwrap())).unwrap();
        let statuses: Vec<_> = back.iter().map(|c| c.status).collect();
        assert_eq!(statuses, [CompensationStatus::Done, CompensationStatus::Registered]);
    }

    #[test]
    fn the_stored_form_is_the_one_older_versions_wrote_and_read() {
        let stored = concat!(
            r#"[{"seq":0,"step_key":"step0","name":"undo","input":"{\"a\":\"\\\"quoted\\\"\"}","status":"done"},"#,
            r#"{"seq":1,"step_key":"step1","name":"undo","input":"{\"a\":\"\\\"quoted\\\"\"}","status":"registered"}]"#,
        );
        let comps = [comp(0, CompensationStatus::Done), comp(1, CompensationStatus::Registered)];
        assert_eq!(encode(&comps).unwrap(), stored);
        assert_eq!(decode("w", Some(stored)).unwrap(), comps);
    }

    #[test]
    fn a_status_this_version_does_not_know_does_not_decode() {
        let stored = r#"[{"seq":0,"step_key":"s","name":"undo","input":"null","status":"skipped"}]"#;
        assert!(decode("w", Some(stored)).is_err());
    }
}
