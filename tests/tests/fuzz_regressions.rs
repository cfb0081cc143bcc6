//! Inputs that once made a fuzz target (`fuzz/`) fail, run through the
//! same bodies (`via_tests::rig::scenarios`) under `cargo test`.

use via_tests::rig::scenarios;

/// receive_path: the peer's own descriptor writes were taken for the
/// engine's (the rig now keeps a shadow of its own writes). In today's
/// input format this is an unreliable run in which the victim posts one
/// more receive (a descriptor the rig writes) and nothing is sent.
#[test]
fn receive_path_rig_writes_are_not_the_engines() {
    scenarios::receive_path(&[0xf6, 0x25]);
}

/// descriptors: an RDMA read scattering over descriptor memory, among
/// them a completed receive's status word; completion is now read from
/// the queues.
#[test]
fn descriptors_read_into_descriptor_memory() {
    scenarios::post_descriptors(&[
        0x01, 0x04, 0x03, 0x03, 0x00, 0x40, 0x00, 0x00, 0x40, 0x00, 0x00, 0x2c, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, //
        0x00, 0x01, 0x2c, 0x01, 0x00, 0x00, 0x01, 0xf4, 0x03, 0x00, 0x41, 0x00, 0x23, 0x00, 0x00, 0x00, 0x00, 0x00, 0x17, 0x06,
    ]);
}
