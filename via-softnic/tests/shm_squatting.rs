//! A shared-memory wire's segment that someone else made is refused: the
//! user nobody (through util-linux's `setpriv`) makes
//! `/dev/shm/via-shm-<wire>` first, as a file open to everyone, a file of
//! its own, or a symbolic link to a file of ours, and a root process opens
//! `shm:<wire>`: refused, with an error naming the file, and nothing
//! written to the file or to where the link points. A segment we make is
//! owner-only whatever the umask, and members racing to make one share it.
//! Needs root.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::sync::{Arc, Barrier};
use via_device::{FrameDevice, MacAddr, TxFrame};
use via_softnic::shm::{remove_wire, segment_path, unguessable_suffix};
use via_softnic::ShmDevice;

const NOBODY: u32 = 65534;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "shm_squatting tests need root (to act as the user nobody with setpriv, and as root)");
}

/// A fresh wire name for `tag`.
fn wire(tag: &str) -> String {
    format!("squat-{tag}-{}-{}", std::process::id(), unguessable_suffix().unwrap())
}

/// Runs the shell `script` (its arguments `$1`...) as the user nobody.
fn as_nobody(script: &str, args: &[&str]) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", script, "sh"])
        .args(args)
        .current_dir("/")
        .output()
        .expect("running setpriv (util-linux)");
    assert!(out.status.success(), "as nobody: {script}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Opens `shm:<wire>` by its VIA name and expects a refusal naming `path`.
fn refused(wire: &str, path: &str) -> String {
    let e = match via_device::open_device(&format!("shm:{wire}"), &[]) {
        Ok(_) => panic!("shm:{wire} opened on a segment made by someone else ({path})"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(path), "the error names the file: {msg}");
    eprintln!("refused, as it should be: {msg}");
    msg
}

#[test]
fn a_segment_another_user_made_is_refused_and_left_alone() {
    require_root();
    for mode in [0o666, 0o600] {
        let w = wire(&format!("{mode:o}"));
        let path = segment_path(&w);
        // Empty, as a squatter leaves it: a member would grow it and
        // make it its segment.
        as_nobody(r#"umask 0 && : > "$1" && chmod "$2" "$1""#, &[&path, &format!("{mode:o}")]);
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (NOBODY, mode), "the squatter's file");
        let msg = refused(&w, &path);
        assert!(msg.contains("owner uid 65534") && msg.contains(&format!("mode 0{mode:o}")), "the error names the owner and mode: {msg}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "nothing written to the squatted file");
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_segment_of_ours_open_to_others_is_refused() {
    require_root();
    let w = wire("ours644");
    let path = segment_path(&w);
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let msg = refused(&w, &path);
    assert!(msg.contains("mode 0644"), "{msg}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "nothing written to it");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_symbolic_link_at_the_segment_name_is_refused() {
    require_root();
    let suffix = format!("{}-{}", std::process::id(), unguessable_suffix().unwrap());
    // A file of root's that nobody wants us to grow or overwrite.
    let victim = format!("/tmp/via-shm-victim-{suffix}");
    std::fs::write(&victim, b"victim").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let absent = format!("/tmp/via-shm-absent-{suffix}");
    for target in [&victim, &absent] {
        let w = wire("link");
        let path = segment_path(&w);
        as_nobody(r#"ln -s "$1" "$2""#, &[target, &path]);
        let msg = refused(&w, &path);
        assert!(msg.contains("symbolic link") && msg.contains(target.as_str()), "{msg}");
        std::fs::remove_file(&path).unwrap();
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"victim", "the link's target is untouched");
    assert!(std::fs::symlink_metadata(&absent).is_err(), "a dangling link's target is not created");
    std::fs::remove_file(&victim).unwrap();
}

#[test]
fn a_fresh_segment_is_owner_only_whatever_the_umask() {
    require_root();
    let w = wire("umask");
    // A umask without the owner's write bit (the other tests here set
    // their files' modes themselves).
    // SAFETY: umask has no preconditions.
    let old = unsafe { libc::umask(0o277) };
    let dev = ShmDevice::open(&w, None);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let dev = dev.unwrap();
    let m = std::fs::metadata(segment_path(&w)).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o600));
    let second = ShmDevice::open(&w, None).expect("a second member opens it");
    drop((dev, second));
    remove_wire(&w);
}

#[test]
fn members_racing_to_make_a_wire_share_one_segment() {
    require_root();
    const MEMBERS: usize = 8;
    let w = wire("race");
    let start = Arc::new(Barrier::new(MEMBERS));
    let threads: Vec<_> = (0..MEMBERS)
        .map(|_| {
            let (w, start) = (w.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                ShmDevice::open(&w, None)
            })
        })
        .collect();
    let mut devs: Vec<ShmDevice> = threads.into_iter().map(|t| t.join().unwrap().expect("every member opens the wire")).collect();
    // One segment: member 0 reaches every other.
    let macs: Vec<MacAddr> = devs.iter().map(|d| d.mac()).collect();
    for (i, mac) in macs.iter().enumerate().skip(1) {
        let mut f = vec![i as u8; 60];
        f[..6].copy_from_slice(&mac.0);
        assert_eq!(devs[0].transmit(&[TxFrame::new(&f)]).unwrap(), 1);
        let mut got = Vec::new();
        devs[i].receive(4, &mut |g| got.push(g.to_vec())).unwrap();
        assert_eq!(got, [f], "member {i}");
    }
    let m = std::fs::metadata(segment_path(&w)).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    drop(devs);
    remove_wire(&w);
}
