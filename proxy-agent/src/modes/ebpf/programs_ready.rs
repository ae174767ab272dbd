//! The packet programs are verified while the first sync fills the maps;
//! that sync reports done only once they are attached, so health and the
//! log never say "synced" before packets are served.

use std::sync::{Arc, Condvar, Mutex};

/// What the loader says: attached, or why not.
type Outcome = Option<Result<(), String>>;

/// Set once by the loader, waited on by the proxier's first sync.
#[derive(Clone, Debug, Default)]
pub struct ProgramsReady(Arc<(Mutex<Outcome>, Condvar)>);

impl ProgramsReady {
    /// The programs are attached (`Ok`) or could not be loaded (why).
    pub fn set(&self, outcome: Result<(), String>) {
        let (lock, ready) = &*self.0;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        ready.notify_all();
    }

    /// Blocks until [`Self::set`]; on the agent's multi-threaded runtime the
    /// worker's other tasks move to another thread meanwhile.
    pub fn wait(&self) -> Result<(), String> {
        let wait = || {
            let (lock, ready) = &*self.0;
            let mut outcome = lock.lock().unwrap_or_else(|e| e.into_inner());
            while outcome.is_none() {
                outcome = ready.wait(outcome).unwrap_or_else(|e| e.into_inner());
            }
            outcome.clone().expect("set")
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProgramsReady;

    #[test]
    fn a_wait_returns_what_the_loader_set_even_when_set_from_another_thread() {
        let ready = ProgramsReady::default();
        let setter = ready.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            setter.set(Err("rejected".into()));
        });
        assert_eq!(ready.wait(), Err("rejected".into()));
        t.join().unwrap();
        assert_eq!(ready.wait(), Err("rejected".into()), "set once, for good");
    }
}
