//! The VIA 1.0 conformance suite: one test per rule, each run across two
//! real hosts (network namespaces joined by a veth pair), one process per
//! side; and again (`through_composite::`) through composite devices, with
//! peers on the same host and on the other host at once; and again
//! (`through_router::`) over VIA in UDP/IPv4 between hosts on two subnets
//! joined by a router namespace. The rules, their
//! areas and texts are in `via_tests::conform` and listed in
//! docs/CONFORMANCE.md. Needs root.

const BIN: &str = env!("CARGO_BIN_EXE_via-conform");

macro_rules! rules {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                via_tests::conform::run(BIN, stringify!($name));
            }
        )*

        mod through_router {
            use super::BIN;
            $(
                #[test]
                fn $name() {
                    via_tests::conform::run_routed(BIN, stringify!($name));
                }
            )*
        }

        mod through_composite {
            use super::BIN;
            $(
                #[test]
                fn $name() {
                    via_tests::conform::run_composite(BIN, stringify!($name));
                }
            )*
        }

        /// Every rule of the suite has a test here (none is left out).
        #[test]
        fn every_rule_has_a_test() {
            let here = [$(stringify!($name)),*];
            for r in via_tests::conform::rules() {
                assert!(here.contains(&r.name), "rule {} has no test in tests/conformance.rs", r.name);
            }
            assert_eq!(here.len(), via_tests::conform::rules().len());
        }
    };
}

rules! {
    // data transfer
    send_immediate_data_arrives_with_status_immediate,
    reliable_reception_send_completes_only_after_placement,
    notify_callbacks_hand_over_completed_descriptors,
    // RDMA
    rdma_write_lands_without_consuming_a_receive,
    rdma_write_with_immediate_consumes_a_receive,
    rdma_read_fetches_remote_memory,
    rdma_read_needs_a_reliable_level,
    qfence_holds_a_descriptor_until_earlier_reads_complete,
    busy_target_serves_rdma_through_the_progress_thread,
    passive_target_serves_rdma_only_inside_calls,
    // protection
    rdma_write_into_region_without_enable_bit_is_refused,
    rdma_write_on_vi_without_enable_bit_is_refused,
    rdma_write_past_the_region_end_is_refused,
    rdma_write_into_region_of_another_ptag_is_refused,
    rdma_read_of_region_without_enable_bit_is_refused,
    unreliable_rdma_violation_is_dropped_and_reported_at_the_target,
    rdma_with_a_forged_memory_handle_is_refused,
    deregistration_revokes_rdma_access_at_once,
    segment_in_memory_of_another_ptag_gives_protection_error,
    descriptor_in_memory_of_another_ptag_gives_protection_error,
    ptag_in_use_cannot_be_destroyed,
    // errors
    malformed_descriptors_complete_with_format_error,
    destroying_a_vi_with_posted_descriptors_fails,
    receive_error_on_reliable_reception_reports_remote_desc_error,
    missing_receive_breaks_a_reliable_connection,
    missing_receive_on_unreliable_is_dropped_and_counted,
    disconnect_flushes_and_the_peer_sees_conn_lost,
    // connections
    mismatched_reliability_level_gives_invalid_reliability_level,
    mismatched_max_transfer_size_gives_invalid_mtu,
    mismatched_rdma_read_enable_gives_invalid_rdmaread,
    connect_wait_reports_the_clients_address_and_attributes,
    peer_to_peer_request_connects_both_vis,
    peer_to_peer_mismatched_attributes_are_refused_on_both_sides,
    peer_request_without_a_peer_times_out,
    // name service
    name_service_discovers_a_host_not_in_the_hosts_file,
    name_service_gives_the_name_of_an_address,
    // queries and attributes
    query_nic_reports_the_device_honestly,
    query_vi_reports_state_attributes_and_queue_emptiness,
    set_vi_attributes_respects_the_state,
    set_mem_attributes_takes_effect_for_later_rdma,
    cq_keeps_completions_past_its_size_and_resizes,
}
