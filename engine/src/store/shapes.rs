//! A one-call commit's SQL by its shape (Postgres: one statement; SQLite: one multi-statement call). The text
//! follows from the phase's text and the form of the checkpoint, not from their values (those are bound): a
//! phase whose text its caller builds once and shares (see [`crate::phase::StatementPhase`]) makes, with a
//! checkpoint of the same form, the same text every time, so it is built once and kept rather than formatted
//! again for every payment. Each backend keeps its own [`Statements`].
//!
//! A shape names the phase's text by the addresses of its shared strings. Its entry holds those strings, so no
//! other text can take an address while the entry names it; a phase built per call, with text of its own, only
//! misses. A cache keeps at most [`CAPACITY`] statements and starts afresh when full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::phase::{PhaseCommit, PhaseRow, PhaseStep, StatementPhase};
use crate::store::Checkpoint;

/// The most statements kept.
const CAPACITY: usize = 256;

/// What a statement's text depends on.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    /// Addresses of the phase's CTEs, guard, and each step's output and condition (0 for none).
    ctes: usize,
    guard: usize,
    steps: Vec<(usize, usize)>,
    /// Number of the phase's arguments (the bookkeeping's parameters follow them).
    args: usize,
    /// The checkpoint's form: the workflow's first commit (an insert) or a fence, its own step rows, and whether
    /// the statement notifies waiters.
    first: bool,
    checkpoint_steps: usize,
    notify: bool,
}

fn address(text: &str) -> usize {
    text.as_ptr() as usize
}

impl Shape {
    /// The shape of a commit of `checkpoint` and `phase`, if it has one: the statement's step rows are written
    /// from `phase.rows`, so only rows that are the phase's steps, one for one and with their text, name it.
    pub(crate) fn of(checkpoint: &Checkpoint<'_>, phase: Option<PhaseCommit<'_>>, notify: bool) -> Option<Self> {
        if let Some(p) = phase {
            let same = |row: &PhaseRow<'_>, step: &PhaseStep| {
                address(row.output) == address(&step.output)
                    && row.when.map(address) == step.when.as_deref().map(address)
            };
            if p.rows.len() != p.phase.steps.len() || !p.rows.iter().zip(&p.phase.steps).all(|(r, s)| same(r, s)) {
                return None;
            }
        }
        Some(Self::with(phase.map(|p| p.phase), checkpoint.is_first(), checkpoint.steps.len(), notify))
    }

    fn with(phase: Option<&StatementPhase>, first: bool, checkpoint_steps: usize, notify: bool) -> Self {
        Self {
            ctes: phase.map_or(0, |p| p.ctes.as_ptr() as usize),
            guard: phase.and_then(|p| p.guard.as_ref()).map_or(0, |(g, _)| address(g)),
            steps: phase.map_or_else(Vec::new, |p| {
                p.steps.iter().map(|s| (address(&s.output), s.when.as_deref().map_or(0, address))).collect()
            }),
            args: phase.map_or(0, |p| p.args.len()),
            first,
            checkpoint_steps,
            notify,
        }
    }
}

/// The shared text a shape names, held by its entry.
struct Held {
    _ctes: Arc<[String]>,
    _texts: Vec<Arc<str>>,
}

impl Held {
    fn of(phase: &StatementPhase) -> Self {
        let mut texts: Vec<Arc<str>> = phase.guard.iter().map(|(g, _)| g.clone()).collect();
        for step in &phase.steps {
            texts.push(step.output.clone());
            texts.extend(step.when.clone());
        }
        Self { _ctes: phase.ctes.clone(), _texts: texts }
    }
}

/// A kept statement, with the text its shape names (none for a commit without a phase).
type Kept = (Arc<str>, Option<Held>);

/// One backend's statements by shape.
#[derive(Default)]
pub(crate) struct Statements(Mutex<HashMap<Shape, Kept>>);

impl Statements {
    /// The statement of `shape`, built by `build` the first time (`phase`: the phase it was built from) and kept
    /// if the phase's text is shared (held elsewhere too, as by a caller that built it once): a phase built per
    /// call would only fill the cache with statements no later call can find.
    pub(crate) fn get(&self, shape: Shape, phase: Option<&StatementPhase>, build: impl FnOnce() -> String) -> Arc<str> {
        if let Some(sql) = self.0.lock().ok().and_then(|kept| kept.get(&shape).map(|(sql, _)| sql.clone())) {
            return sql;
        }
        let sql: Arc<str> = Arc::from(build());
        if phase.is_some_and(|p| Arc::strong_count(&p.ctes) < 2) {
            return sql;
        }
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() >= CAPACITY {
                kept.clear();
            }
            kept.insert(shape, (sql.clone(), phase.map(Held::of)));
        }
        sql
    }
}

/// The statement of a commit of `checkpoint` and `phase` from `statements`, or built by `build` when the commit
/// has no shape (see [`Shape::of`]).
pub(crate) fn statement(
    statements: &Statements,
    checkpoint: &Checkpoint<'_>,
    phase: Option<PhaseCommit<'_>>,
    notify: bool,
    build: impl FnOnce() -> String,
) -> Arc<str> {
    match Shape::of(checkpoint, phase, notify) {
        Some(shape) => statements.get(shape, phase.map(|p| p.phase), build),
        None => Arc::from(build()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::phase::{PhaseStep, SqlArg};
    use crate::step::step;

    fn phase(text: &str) -> StatementPhase {
        let steps = vec![PhaseStep::new(step("s"), format!("'{text}'")).when(format!("{text} IS NOT NULL"))];
        StatementPhase::new(vec![format!("p AS ({text})")], vec![SqlArg::Int(1)], steps)
    }

    fn text(p: &StatementPhase) -> String {
        format!("{} {} {:?}", p.ctes.join(", "), p.steps[0].output, p.steps[0].when)
    }

    /// A phase whose text is shared makes its statement once; phases with text of their own — made and dropped
    /// one after another, so that one may be given the address of another gone before it, and more than the cache
    /// keeps — each get the statement of their own text.
    #[test]
    fn a_shared_text_is_built_once_and_no_text_is_taken_for_another() {
        let statements = Statements::default();
        // Kept by its maker, as a caller keeps a text it built once.
        let template = phase("shared");
        let shared = template.clone();
        let built = AtomicUsize::new(0);
        let build = || {
            built.fetch_add(1, Ordering::Relaxed);
            text(&shared)
        };
        let one = statements.get(Shape::with(Some(&shared), true, 0, false), Some(&shared), build);
        let again = statements.get(Shape::with(Some(&shared.clone()), true, 0, false), Some(&shared), build);
        assert!(Arc::ptr_eq(&one, &again));
        assert_eq!(built.load(Ordering::Relaxed), 1);
        // Another form of the checkpoint is another statement.
        let fence = statements.get(Shape::with(Some(&shared), false, 0, true), Some(&shared), || "fence".to_owned());
        assert_eq!(&*fence, "fence");
        for i in 0..3 * CAPACITY {
            let own = phase(&format!("own{i}"));
            let sql = statements.get(Shape::with(Some(&own), true, 0, false), Some(&own), || text(&own));
            assert_eq!(*sql, text(&own), "phase {i}");
            // Kept like a shared text (another holder of its text), as when a caller keeps it.
            let kept = own.clone();
            let sql = statements.get(Shape::with(Some(&own), false, 0, false), Some(&own), || text(&own));
            assert_eq!(*sql, text(&kept), "phase {i}");
        }
        // A text of its own is not kept.
        let own = phase("not kept");
        let built = AtomicUsize::new(0);
        for _ in 0..2 {
            statements.get(Shape::with(Some(&own), true, 0, false), Some(&own), || {
                built.fetch_add(1, Ordering::Relaxed);
                text(&own)
            });
        }
        assert_eq!(built.load(Ordering::Relaxed), 2);
    }
}
