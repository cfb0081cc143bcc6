//! What the demo must undo if it is interrupted: the child processes it
//! started and the network namespaces it made (the demo's guard and its
//! signal thread read this; the transports' runs add to it).

use std::sync::Mutex;

/// What must be undone if a signal arrives: child pids and namespaces.
static CREATED: Mutex<(Vec<u32>, Vec<String>)> = Mutex::new((Vec::new(), Vec::new()));

pub fn created() -> std::sync::MutexGuard<'static, (Vec<u32>, Vec<String>)> {
    CREATED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records a child process to kill if the demo is interrupted.
pub fn track(pid: u32) {
    created().0.push(pid);
}

/// Forgets a child that has exited.
pub fn untrack(pid: u32) {
    created().0.retain(|p| *p != pid);
}
