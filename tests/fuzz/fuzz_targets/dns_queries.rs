//! DNS messages of arbitrary bytes through the cluster DNS's decoding and answering: none
//! may panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    skiff_dns::fuzzing::answer_bytes(data);
});
