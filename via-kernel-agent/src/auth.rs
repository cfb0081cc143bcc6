//! Frame authentication: the cluster secret and the keys derived from it
//! for the keyed MAC that replaces the CRC-32C when a secret is configured.
//!
//! - The **cluster secret** is a file readable only by its owner (the
//!   caller's uid): [`ClusterSecret::load`] refuses anything else, naming
//!   the file and its mode. [`SECRET_ENV`] (`VIA_SECRET=/path`) points at it.
//! - Connection-management frames (request, accept, reject, no-match,
//!   disconnect, peer request/accept, name query/reply) are authenticated
//!   under [`ClusterSecret::cm_key`], derived from the secret alone.
//! - Every frame of a connection is authenticated under a key of its
//!   direction ([`ClusterSecret::connection_keys`]), derived from the secret,
//!   both sides' fresh nonces (carried in the request and the accept), both
//!   ends' endpoint and VI ids, and the connection's generation. MAC
//!   addresses are left out: composite devices rewrite them on the way.
//! - The MAC itself, the tag every authenticated frame carries, is
//!   [`via_wire::tag`]'s (AEGISMAC-128L, or 128X4 for long payloads).
//! - Keys are derived with BLAKE3's `derive_key` (the `blake3` crate).
//!
//! Replays are refused by what already refuses duplicates: a replayed data
//! frame carries a PSN the receiver has passed.

use std::fmt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub use via_wire::{Nonce, NONCE_LEN};
use via_wire::tag::{Key, KEY_LEN};

/// The environment variable naming the cluster secret file.
pub const SECRET_ENV: &str = "VIA_SECRET";
/// Shortest and longest secret file accepted.
pub const SECRET_MIN: usize = 16;
pub const SECRET_MAX: usize = 4096;

const CONTEXT_SECRET: &str = "via-rs 2026-11 cluster secret";
const CONTEXT_CM: &str = "via-rs 2026-11 connection management frame key (AEGISMAC-128L)";
const CONTEXT_CONN: &str = "via-rs 2026-11 connection frame key (AEGISMAC-128L)";

/// Why a secret could not be used.
#[derive(Debug)]
pub enum SecretError {
    /// The file could not be opened or read.
    Io(PathBuf, std::io::Error),
    /// Group or other may read or write it, or it is not a regular file.
    Mode(PathBuf, u32),
    /// Another uid owns it.
    Owner(PathBuf, u32, u32),
    /// Too short (or too long) to be a secret.
    Length(PathBuf, u64),
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::Io(p, e) => write!(f, "cluster secret {}: {e}", p.display()),
            SecretError::Mode(p, m) => write!(f, "cluster secret {} has mode {:04o}: it must be a regular file readable only by its owner (chmod 600)", p.display(), m & 0o7777),
            SecretError::Owner(p, owner, me) => write!(f, "cluster secret {} is owned by uid {owner}, not by this process's uid {me}", p.display()),
            SecretError::Length(p, n) => write!(f, "cluster secret {} holds {n} bytes: a secret has {SECRET_MIN} to {SECRET_MAX}", p.display()),
        }
    }
}

impl std::error::Error for SecretError {}

/// The secret every host of a cluster shares (32 bytes derived from the file).
#[derive(Clone)]
pub struct ClusterSecret([u8; 32]);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// One end of a connection, as both ends name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnEnd {
    pub ep: u32,
    pub vi: u16,
    pub nonce: Nonce,
}

impl ConnEnd {
    fn bytes(&self) -> [u8; 22] {
        let mut b = [0u8; 22];
        b[..4].copy_from_slice(&self.ep.to_be_bytes());
        b[4..6].copy_from_slice(&self.vi.to_be_bytes());
        b[6..].copy_from_slice(&self.nonce);
        b
    }
}

/// The keys of one connection as one end sees them.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnKeys {
    /// What this end's frames are authenticated with.
    pub tx: Key,
    /// What the peer's frames must be authenticated with.
    pub rx: Key,
}

impl fmt::Debug for ConnKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConnKeys(..)")
    }
}

impl ClusterSecret {
    /// The secret whose file content is `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> ClusterSecret {
        ClusterSecret(blake3::derive_key(CONTEXT_SECRET, bytes))
    }

    /// Reads the secret at `path`: a regular file of this uid, mode without
    /// group or other bits, of [`SECRET_MIN`] to [`SECRET_MAX`] bytes.
    pub fn load(path: &Path) -> Result<ClusterSecret, SecretError> {
        use std::io::Read;
        let io = |e| SecretError::Io(path.to_path_buf(), e);
        let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() || meta.mode() & 0o077 != 0 {
            return Err(SecretError::Mode(path.to_path_buf(), meta.mode()));
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(SecretError::Owner(path.to_path_buf(), meta.uid(), me));
        }
        if !(SECRET_MIN as u64..=SECRET_MAX as u64).contains(&meta.len()) {
            return Err(SecretError::Length(path.to_path_buf(), meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).map_err(io)?;
        let s = ClusterSecret::from_bytes(&bytes);
        bytes.fill(0);
        Ok(s)
    }

    /// The secret [`SECRET_ENV`] names, if it is set (and not empty).
    pub fn from_env() -> Result<Option<ClusterSecret>, SecretError> {
        match std::env::var_os(SECRET_ENV) {
            Some(p) if !p.is_empty() => ClusterSecret::load(Path::new(&p)).map(Some),
            _ => Ok(None),
        }
    }

    /// The key of connection-management frames.
    pub fn cm_key(&self) -> Key {
        expand(CONTEXT_CM, &self.0)
    }

    /// The keys of the connection between `me` and `peer` of generation
    /// `generation`: each direction its own, the same on both ends.
    pub fn connection_keys(&self, me: &ConnEnd, peer: &ConnEnd, generation: u32) -> ConnKeys {
        let (a, b) = (me.bytes(), peer.bytes());
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let key_from = |sender: &[u8; 22]| {
            let mut m = Vec::with_capacity(32 + 3 * 22 + 4);
            m.extend_from_slice(&self.0);
            m.extend_from_slice(&lo);
            m.extend_from_slice(&hi);
            m.extend_from_slice(&generation.to_be_bytes());
            m.extend_from_slice(sender);
            expand(CONTEXT_CONN, &m)
        };
        ConnKeys { tx: key_from(&a), rx: key_from(&b) }
    }
}

/// A [`Key`] derived (BLAKE3 `derive_key` mode) from `material` in `context`.
fn expand(context: &str, material: &[u8]) -> Key {
    let mut out = [0u8; KEY_LEN];
    blake3::Hasher::new_derive_key(context).update(material).finalize_xof().fill(&mut out);
    Key::new(out)
}

/// A fresh random nonce (getrandom).
pub fn fresh_nonce() -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    fill_random(&mut n);
    n
}

/// Fills `buf` from the kernel's random source.
pub fn fill_random(buf: &mut [u8]) {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: getrandom writes at most `buf.len() - at` bytes at that offset.
        let n = unsafe { libc::getrandom(buf[at..].as_mut_ptr().cast(), buf.len() - at, 0) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            assert!(e.kind() == std::io::ErrorKind::Interrupted, "getrandom failed: {e}");
            continue;
        }
        at += n as usize;
    }
}

/// What an engine holds when a secret is configured: the
/// connection-management key and each VI's connection keys.
#[derive(Clone, Debug)]
pub struct Keyring {
    pub secret: ClusterSecret,
    pub cm: Key,
    /// Indexed by VI id - 1.
    vis: Vec<Option<ConnKeys>>,
    /// Our nonce of each VI's pending request or accept (VI id, nonce,
    /// the host asked).
    nonces: Vec<(u16, Nonce, Option<via_wire::MacAddr>)>,
    /// Hosts that sent us connection management without (valid)
    /// authentication lately: why a request to them went unanswered.
    unauthenticated: Vec<via_wire::MacAddr>,
}

/// Hosts remembered in [`Keyring::saw_unauthenticated`].
const UNAUTHENTICATED_KEPT: usize = 16;

impl Keyring {
    pub fn new(secret: ClusterSecret) -> Keyring {
        Keyring { cm: secret.cm_key(), secret, vis: Vec::new(), nonces: Vec::new(), unauthenticated: Vec::new() }
    }

    /// A fresh nonce for VI `vi`'s request to `asked` (or accept),
    /// remembered until the request settles ([`Keyring::take_nonce`]).
    pub fn new_nonce(&mut self, vi: u16, asked: Option<via_wire::MacAddr>) -> Nonce {
        let n = fresh_nonce();
        self.nonces.retain(|(v, ..)| *v != vi);
        self.nonces.push((vi, n, asked));
        n
    }

    /// VI `vi`'s nonce and the host its request asked, forgotten as taken.
    pub fn take_nonce(&mut self, vi: u16) -> Option<(Nonce, Option<via_wire::MacAddr>)> {
        let i = self.nonces.iter().position(|(v, ..)| *v == vi)?;
        let (_, n, asked) = self.nonces.swap_remove(i);
        Some((n, asked))
    }

    /// Notes that `mac` sent connection management we could not authenticate.
    pub fn saw_unauthenticated(&mut self, mac: via_wire::MacAddr) {
        if !self.unauthenticated.contains(&mac) {
            if self.unauthenticated.len() == UNAUTHENTICATED_KEPT {
                self.unauthenticated.remove(0);
            }
            self.unauthenticated.push(mac);
        }
    }

    /// Did `mac` send us unauthenticated connection management lately?
    pub fn sent_unauthenticated(&self, mac: via_wire::MacAddr) -> bool {
        self.unauthenticated.contains(&mac)
    }

    /// VI `vi`'s keys, while it is connected.
    pub fn vi(&self, vi: u16) -> Option<&ConnKeys> {
        self.vis.get((vi as usize).wrapping_sub(1)).and_then(Option::as_ref)
    }

    /// Installs VI `vi`'s keys (a connection was made).
    pub fn set_vi(&mut self, vi: u16, keys: ConnKeys) {
        let i = (vi as usize).wrapping_sub(1);
        if i >= self.vis.len() {
            self.vis.resize(i + 1, None);
        }
        self.vis[i] = Some(keys);
    }

    /// Forgets VI `vi`'s keys (it disconnected or went away).
    pub fn clear_vi(&mut self, vi: u16) {
        if let Some(k) = self.vis.get_mut((vi as usize).wrapping_sub(1)) {
            *k = None;
        }
    }
}

/// Writes a fresh random secret (32 bytes) to `path`, created exclusively
/// with mode 0600: what mttl-run makes for each run.
pub fn create_secret_file(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    let mut s = [0u8; 32];
    fill_random(&mut s);
    f.write_all(&s)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn end(ep: u32, vi: u16, n: u8) -> ConnEnd {
        ConnEnd { ep, vi, nonce: [n; NONCE_LEN] }
    }

    #[test]
    fn both_ends_derive_the_same_keys_each_direction_its_own() {
        let s = ClusterSecret::from_bytes(b"sixteen bytes at least");
        let (a, b) = (end(10, 1, 1), end(20, 2, 2));
        let ka = s.connection_keys(&a, &b, 7);
        let kb = s.connection_keys(&b, &a, 7);
        assert_eq!((&ka.tx, &ka.rx), (&kb.rx, &kb.tx), "what one sends the other checks");
        assert_ne!(ka.tx, ka.rx, "each direction its own key");
        assert_ne!(ka.tx, s.cm_key());
        // Anything else different, other keys.
        for other in [s.connection_keys(&a, &b, 8), s.connection_keys(&end(10, 1, 3), &b, 7), s.connection_keys(&a, &end(21, 2, 2), 7), s.connection_keys(&a, &end(20, 3, 2), 7), ClusterSecret::from_bytes(b"another secret, same length").connection_keys(&a, &b, 7)] {
            assert_ne!(other.tx, ka.tx);
            assert_ne!(other.rx, ka.rx);
        }
        assert_ne!(ClusterSecret::from_bytes(b"another secret!!").cm_key(), s.cm_key());
    }

    fn secret_file(name: &str, mode: u32, content: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("via-auth-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn only_a_private_file_of_ours_is_a_secret() {
        let ok = secret_file("ok", 0o600, b"0123456789abcdef0123");
        let a = ClusterSecret::load(&ok).unwrap();
        assert_eq!(a.cm_key(), ClusterSecret::from_bytes(b"0123456789abcdef0123").cm_key());
        let ro = secret_file("ro", 0o400, b"0123456789abcdef0123");
        assert!(ClusterSecret::load(&ro).is_ok());
        for (name, mode) in [("group", 0o640), ("other", 0o604), ("gw", 0o620)] {
            let p = secret_file(name, mode, b"0123456789abcdef0123");
            let e = ClusterSecret::load(&p).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, SecretError::Mode(..)), "{msg}");
            assert!(msg.contains(&p.display().to_string()) && msg.contains(&format!("{mode:04o}")), "{msg}");
            let _ = std::fs::remove_file(p);
        }
        let short = secret_file("short", 0o600, b"too short");
        assert!(matches!(ClusterSecret::load(&short), Err(SecretError::Length(_, 9))));
        let missing = std::env::temp_dir().join("via-auth-test-no-such-file");
        assert!(matches!(ClusterSecret::load(&missing), Err(SecretError::Io(..))));
        // Another owner: chown to nobody (we are root in the test rig).
        let theirs = secret_file("theirs", 0o600, b"0123456789abcdef0123");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let e = ClusterSecret::load(&theirs).unwrap_err();
            assert!(matches!(e, SecretError::Owner(_, 65534, 0)), "{e}");
        }
        for p in [ok, ro, short, theirs] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn a_made_secret_is_private_and_loads() {
        let p = std::env::temp_dir().join(format!("via-auth-test-{}-made", std::process::id()));
        let _ = std::fs::remove_file(&p);
        create_secret_file(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert!(ClusterSecret::load(&p).is_ok());
        assert!(create_secret_file(&p).is_err(), "never over an existing file");
        let _ = std::fs::remove_file(p);
    }
}
