//! The credential parsers (token file, certificates and chains, Authorization and
//! impersonation headers, kubeconfigs) on arbitrary bytes: none may panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    skiff_apiserver::auth::fuzzing::decode_credentials(data);
});
