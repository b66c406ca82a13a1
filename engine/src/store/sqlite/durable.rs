//! Commits made durable off SQLite's one write path: the group committer commits a group without waiting for the
//! disk (`synchronous = NORMAL` on its connection: the WAL is written, not flushed) and hands its answers here; a
//! thread of this store flushes the WAL file (`fdatasync`) and only then sends them. Meanwhile the next group runs,
//! so a flush no longer holds up the writer, and one flush serves every group that committed while the last one ran.
//!
//! A commit is answered only once it is on disk, as before. What changes is that another connection may read a
//! committed row up to one flush before it is on disk; after a power loss (not a crash of the process: the
//! kernel has the data) such a commit can be gone, together with every later one, and its workflow, which was
//! never answered, resumes from the commit before.
//!
//! The WAL is flushed through one handle, opened (by the committer, see `Durable::open`) before its connection
//! commits anything and again whenever it opens another connection, so that a write-back error of the kernel is
//! reported to this handle. A flush that fails stops the thread for good ([`Durable::failed`]): the kernel may
//! have dropped the pages it could not write, so a later flush that succeeds would not mean that the commits
//! before it are on disk. Every commit it held, and every later one, is answered with an error (an unknown outcome,
//! as a lost reply: committed, perhaps not on disk) until the process restarts.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use tokio::sync::oneshot;

/// An answer held until the commit it reports is on disk.
pub(super) type Pending<T> = (oneshot::Sender<Result<T, sqlx::Error>>, Result<T, sqlx::Error>);

/// What the flushing thread is sent, in order.
enum Message<T> {
    /// Answers of commits written to the WAL.
    Answers(Vec<Pending<T>>),
    /// The WAL to flush from now on (the committer opened another connection).
    Wal(File),
}

/// The flushing thread of one database's WAL file (it ends when this is dropped).
#[derive(Debug)]
pub(super) struct Durable<T> {
    messages: mpsc::Sender<Message<T>>,
    failed: Arc<AtomicBool>,
}

impl<T: Send + 'static> Durable<T> {
    /// Starts the thread, flushing `wal` (opened by [`Durable::open`]).
    pub(super) fn start(wal: File) -> std::io::Result<Self> {
        let (messages, queue) = mpsc::channel();
        let failed = Arc::new(AtomicBool::new(false));
        let stop = failed.clone();
        std::thread::Builder::new().name("onceflow-sqlite-sync".to_owned()).spawn(move || flush(wal, &queue, &stop))?;
        Ok(Self { messages, failed })
    }

    /// Opens the WAL of the database file `database` for flushing, after flushing its folder once (so that a
    /// WAL file made since is found after a power loss).
    pub(super) fn open(database: &Path) -> std::io::Result<File> {
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        let file = std::fs::OpenOptions::new().read(true).write(true).open(wal)?;
        if let Some(folder) = database.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(folder)?.sync_all()?;
        }
        Ok(file)
    }

    /// Flushes `wal` from now on, for the answers sent after this (those before go with the file before).
    pub(super) fn reopened(&self, wal: File) {
        let _ = self.messages.send(Message::Wal(wal));
    }

    /// A flush failed: no commit is answered as written any more.
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Sends `answers` once the WAL, as written by now, is on disk.
    pub(super) fn answer(&self, answers: Vec<Pending<T>>) {
        // The thread is gone (it panicked): whether these commits reached the disk is not known.
        if let Err(mpsc::SendError(Message::Answers(answers))) = self.messages.send(Message::Answers(answers)) {
            for (reply, _) in answers {
                let _ = reply.send(Err(sqlx::Error::WorkerCrashed));
            }
        }
    }
}

/// Flushes the WAL for every batch of answers queued meanwhile, then sends them. After a flush fails, none is
/// flushed again and every answer is that error (see the module's documentation).
fn flush<T>(mut wal: File, queue: &mpsc::Receiver<Message<T>>, failed: &AtomicBool) {
    let mut error: Option<std::io::Error> = None;
    while let Ok(first) = queue.recv() {
        let mut answers = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next.take().or_else(|| queue.try_recv().ok()) {
            match message {
                Message::Answers(more) => answers.extend(more),
                Message::Wal(file) => {
                    // Those written before go with the file they were written to.
                    settle(&wal, &mut error, failed, std::mem::take(&mut answers));
                    wal = file;
                }
            }
        }
        settle(&wal, &mut error, failed, answers);
    }
}

/// Flushes `wal` (unless a flush failed before) and sends `answers`.
fn settle<T>(wal: &File, error: &mut Option<std::io::Error>, failed: &AtomicBool, answers: Vec<Pending<T>>) {
    if answers.is_empty() {
        return;
    }
    if error.is_none()
        && let Err(e) = wal.sync_data()
    {
        tracing::error!(error = %e, "flushing SQLite's WAL failed: no commit is answered until the process restarts");
        failed.store(true, Ordering::Release);
        *error = Some(e);
    }
    for (reply, rows) in answers {
        let rows = match &error {
            None => rows,
            Some(e) => Err(sqlx::Error::Io(std::io::Error::new(e.kind(), format!("the WAL was not flushed: {e}")))),
        };
        let _ = reply.send(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer<T: Send + 'static>(durable: &Durable<T>, value: T) -> oneshot::Receiver<Result<T, sqlx::Error>> {
        let (reply, answer) = oneshot::channel();
        durable.answer(vec![(reply, Ok(value))]);
        answer
    }

    /// Answers come back as given once the file is flushed, before and after the file changes.
    #[tokio::test]
    async fn answers_follow_the_flush() {
        let database = std::env::temp_dir().join(format!("onceflow-durable-{}", uuid::Uuid::new_v4()));
        let wal = format!("{}-wal", database.display());
        std::fs::write(&wal, b"frames").unwrap();
        let durable = Durable::start(Durable::<u32>::open(&database).unwrap()).unwrap();
        let (one, two) = (answer(&durable, 1), answer(&durable, 2));
        durable.reopened(Durable::<u32>::open(&database).unwrap());
        let three = answer(&durable, 3);
        assert_eq!((one.await.unwrap().unwrap(), two.await.unwrap().unwrap()), (1, 2));
        assert_eq!(three.await.unwrap().unwrap(), 3);
        assert!(!durable.failed());
        std::fs::remove_file(wal).unwrap();
    }

    /// A flush that fails answers every commit it held with its error, and every later one: none is answered as
    /// written again, even where a later flush would succeed.
    #[tokio::test]
    async fn a_failed_flush_fails_every_later_answer() {
        // `fdatasync` on /dev/null fails (EINVAL).
        let durable = Durable::start(File::options().write(true).open("/dev/null").unwrap()).unwrap();
        assert!(matches!(answer(&durable, 1).await.unwrap(), Err(sqlx::Error::Io(_))));
        assert!(durable.failed());
        let database = std::env::temp_dir().join(format!("onceflow-durable-{}", uuid::Uuid::new_v4()));
        let wal = format!("{}-wal", database.display());
        std::fs::write(&wal, b"frames").unwrap();
        durable.reopened(Durable::<u32>::open(&database).unwrap());
        assert!(matches!(answer(&durable, 2).await.unwrap(), Err(sqlx::Error::Io(_))));
        std::fs::remove_file(wal).unwrap();
    }
}
