//! The layer unpacker on arbitrary bytes (a tarball, gzip-compressed when they start with
//! gzip's magic), unpacked into a layer directory beside sentinel files: whether the layer
//! unpacks or is refused, nothing outside its directory may change and nothing may panic.
//! Needs root (whiteouts are device nodes), as the node agent has.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let sandbox = skiff_image::fuzzing::Sandbox::new();
    let _ = sandbox.unpack(data);
});
