//! Deferred serve calls: a call whose served file must be fetched first ([`Lookup::Fetch`]) is
//! handed off the receive loop to a worker thread ([`Deferred`]) that fetches and then answers
//! the notification itself, so the loop never waits. Served directories and their resolvers
//! are the realm filesystems' ([`realmfs::serve`]).
#![forbid(unsafe_code)]

pub use realmfs::serve::{LocalDirs, Lookup, Resolver, Served};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// A call handed off the receive loop: the worker runs `job` and answers the notification.
pub type Job = Box<dyn FnOnce() + Send>;

/// Worker threads for deferred serve calls, started on first use.
#[derive(Default)]
pub struct Deferred {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
}

impl Deferred {
    const WORKERS: usize = 2;

    pub fn submit(&self, job: Job) {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let sender = tx.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..Self::WORKERS {
                let rx = Arc::clone(&rx);
                let _ = std::thread::Builder::new()
                    .name(format!("sigma-serve-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    });
            }
            tx
        });
        let _ = sender.send(job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_jobs_run_off_the_submitting_thread() {
        let d = Deferred::default();
        let (tx, rx) = mpsc::channel();
        let me = std::thread::current().id();
        for i in 0..4 {
            let tx = tx.clone();
            d.submit(Box::new(move || {
                let _ = tx.send((i, std::thread::current().id() != me));
            }));
        }
        let mut got: Vec<_> = (0..4).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, [(0, true), (1, true), (2, true), (3, true)]);
    }
}
