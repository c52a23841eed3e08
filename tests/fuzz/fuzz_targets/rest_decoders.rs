//! The REST API's request decoders (paths, query parameters, Accept headers, JSON and YAML
//! bodies decoded as every kind, the three patch types) on arbitrary bytes: none may panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    skiff_apiserver::fuzzing::decode_request(data);
});
