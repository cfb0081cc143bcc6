//! The one error of the communication layer and of start-up: a message
//! saying what failed (a peer, a device, the rendezvous).

use std::fmt;

/// A communication failure; the process cannot go on.
#[derive(Debug, Clone)]
pub struct CommError(pub String);

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommError {}

pub type Result<T> = std::result::Result<T, CommError>;
