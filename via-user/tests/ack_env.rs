//! The ACK tunables read from the environment: `VIA_ACK_EVERY` (0 takes an
//! eighth of the window, as the README says) and `VIA_ACK_IDLE_US`. Alone
//! in its test binary: it sets environment variables.

use std::time::Duration;
use via_user::Config;

#[test]
fn the_ack_tunables_come_from_the_environment() {
    // SAFETY (edition 2021: safe): this binary's only test, one thread.
    std::env::remove_var("VIA_ACK_EVERY");
    std::env::remove_var("VIA_ACK_IDLE_US");
    let c = Config::from_env();
    assert_eq!((c.ack_every, c.ack_idle), (32, Duration::from_micros(20)), "the defaults");
    std::env::set_var("VIA_ACK_EVERY", "0");
    std::env::set_var("VIA_ACK_IDLE_US", "50");
    let c = Config::from_env();
    assert_eq!((c.ack_every, c.ack_idle), (0, Duration::from_micros(50)), "0 stays 0: an eighth of the window");
    assert_eq!(via_user::ack_every_for(1024), 128);
    assert_eq!(via_user::ack_every_for(40), 32, "at least 32");
    std::env::set_var("VIA_ACK_EVERY", "128");
    assert_eq!(Config::from_env().ack_every, 128);
}
