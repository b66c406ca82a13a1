//! Commits made durable off SQLite's one write path: the group committer commits without waiting for the disk
//! (`synchronous = NORMAL` on its connection: the WAL is written, not flushed) and hands its answers here; a thread
//! of this store flushes the WAL file (`fdatasync`) and only then sends them. Meanwhile the next group runs, so a
//! flush no longer holds up the writer, and one flush serves every group that committed while the last one ran.
//!
//! A commit is answered only once it is on disk, as before. What changes is that another connection may read a
//! committed row up to one flush before it is on disk; after a power loss (not a crash of the process: the
//! kernel has the data) such a commit can be gone, together with every later one, and its workflow, which was
//! never answered, resumes from the commit before.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use tokio::sync::oneshot;

/// An answer held until the commit it reports is on disk.
pub(super) type Pending<T> = (oneshot::Sender<Result<T, sqlx::Error>>, Result<T, sqlx::Error>);

/// The flushing thread of one database's WAL file (it ends when this is dropped).
#[derive(Debug)]
pub(super) struct Durable<T> {
    answers: mpsc::Sender<Vec<Pending<T>>>,
}

impl<T: Send + 'static> Durable<T> {
    /// Starts the thread flushing `wal` (the database file's path with `-wal` appended).
    pub(super) fn start(wal: PathBuf) -> std::io::Result<Self> {
        let (answers, queue) = mpsc::channel();
        std::thread::Builder::new().name("onceflow-sqlite-sync".to_owned()).spawn(move || flush(&wal, &queue))?;
        Ok(Self { answers })
    }

    /// Sends `answers` once the WAL, as written by now, is on disk.
    pub(super) fn answer(&self, answers: Vec<Pending<T>>) {
        if let Err(mpsc::SendError(unsent)) = self.answers.send(answers) {
            // The thread is gone (it panicked): whether these commits reached the disk is not known.
            for (reply, _) in unsent {
                let _ = reply.send(Err(sqlx::Error::WorkerCrashed));
            }
        }
    }
}

/// Flushes `wal` for every batch of answers queued meanwhile, then sends them; a failed flush answers them with
/// its error (their commits are in the database, but perhaps not on disk: an unknown outcome, as a lost reply).
fn flush<T>(wal: &Path, queue: &mpsc::Receiver<Vec<Pending<T>>>) {
    while let Ok(mut answers) = queue.recv() {
        while let Ok(more) = queue.try_recv() {
            answers.extend(more);
        }
        let flushed = File::open(wal).and_then(|f| f.sync_data());
        if let Err(e) = &flushed {
            tracing::error!(error = %e, wal = %wal.display(), "flushing SQLite's WAL failed");
        }
        for (reply, rows) in answers {
            let rows = match &flushed {
                Ok(()) => rows,
                Err(e) => Err(sqlx::Error::Io(std::io::Error::new(e.kind(), e.to_string()))),
            };
            let _ = reply.send(rows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers come back as given once the file is flushed, in one batch or several.
    #[tokio::test]
    async fn answers_follow_the_flush() {
        let wal = std::env::temp_dir().join(format!("onceflow-durable-{}-wal", uuid::Uuid::new_v4()));
        std::fs::write(&wal, b"frames").unwrap();
        let durable = Durable::start(wal.clone()).unwrap();
        let mut waiting = Vec::new();
        for n in 0..3 {
            let (reply, answer) = oneshot::channel();
            durable.answer(vec![(reply, Ok(n))]);
            waiting.push(answer);
        }
        for (n, answer) in waiting.into_iter().enumerate() {
            assert_eq!(answer.await.unwrap().unwrap(), n);
        }
        std::fs::remove_file(wal).unwrap();
    }

    /// A flush that fails answers every commit it held with its error, never with the commit's rows.
    #[tokio::test]
    async fn a_failed_flush_answers_with_its_error() {
        let wal = std::env::temp_dir().join(format!("onceflow-durable-{}-wal", uuid::Uuid::new_v4()));
        let durable = Durable::start(wal).unwrap();
        let (reply, answer) = oneshot::channel();
        durable.answer(vec![(reply, Ok(1))]);
        match answer.await.unwrap() {
            Err(sqlx::Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
            other => panic!("expected the flush's error, got {other:?}"),
        }
    }
}
