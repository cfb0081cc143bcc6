//! What the integration tests over the shared-memory wire share.

/// A shared-memory wire of one test's own, named `<prefix>-<pid>-<random>`
/// so that tests running at once never meet; its segment is removed when
/// the test ends, passed or failed.
pub struct Wire(pub String);

impl Wire {
    pub fn new(prefix: &str) -> Wire {
        Wire(format!("{prefix}-{}-{}", std::process::id(), via_softnic::shm::unguessable_suffix().unwrap()))
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        via_softnic::shm::remove_wire(&self.0);
    }
}
